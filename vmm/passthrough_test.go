package vmm

import (
	"bytes"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/iommu"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// slowBackend is an IOMMU backend whose MapDMA takes delay.
type slowBackend struct{ delay time.Duration }

func (b slowBackend) IOMMUInfo() (uapi.VFIOIOMMUInfo, error)  { return uapi.VFIOIOMMUInfo{}, nil }
func (b slowBackend) MapDMA(uint64, []byte, uint32) error     { time.Sleep(b.delay); return nil }
func (b slowBackend) UnmapDMA(_, size uint64) (uint64, error) { return size, nil }
func (b slowBackend) Close() error                            { return nil }

func TestP2PLoggerLogsEveryMappingAndWarnsWhenSlow(t *testing.T) {
	for _, tc := range []struct {
		name string
		slow time.Duration
		warn bool
	}{{"fast", time.Hour, false}, {"slow", time.Millisecond, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctr, err := iommu.NewWithBackend(slowBackend{delay: 2 * time.Millisecond})
			require.NoError(t, err)
			var buf bytes.Buffer
			p := p2pLogger{ctr: ctr, log: slog.New(slog.NewTextHandler(&buf, nil)), slow: tc.slow}
			require.NoError(t, p.MapBAR(64<<30, make([]byte, 8192), "00:06.0 BAR2"))
			out := buf.String()
			assert.Contains(t, out, `msg="DMA mapping" kind=BAR name="00:06.0 BAR2" iova=0x1000000000 size=8192 took=`)
			assert.Equal(t, tc.warn, bytes.Contains(buf.Bytes(), []byte("--p2p=false")), "warning about a slow mapping in %q", out)
			m, ok := ctr.Mapping(64 << 30)
			require.True(t, ok)
			assert.GreaterOrEqual(t, m.Took, 2*time.Millisecond, "the MAP_DMA call's duration")

			buf.Reset()
			require.NoError(t, p.Unmap(64<<30))
			assert.Contains(t, buf.String(), `msg="DMA unmapping" kind=BAR name="00:06.0 BAR2" iova=0x1000000000 size=8192 took=`)
			assert.Empty(t, ctr.Mappings())
		})
	}
}
