package harness

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFormatParseFieldsRoundTrip(t *testing.T) {
	fields := []Field{
		{"test", "TestBootStockKernel/cpus=4"},
		{"key", "l2_console_tail"},
		{"value", "line one\nline \"two\"\r\n"},
		{"empty", ""},
	}
	s := FormatFields(fields...)
	assert.NotContains(t, s, "\n", "records must stay on one line")
	got, err := ParseFields(s)
	require.NoError(t, err)
	assert.Equal(t, fields, got)
	assert.Equal(t, "a=1 b=x", FormatFields(Field{"a", "1"}, Field{"b", "x"}), "plain values stay unquoted")
}

func TestParseFieldsErrors(t *testing.T) {
	for _, in := range []string{"novalue", "=x", `k="unterminated`, `k="a"junk`, "a b=c"} {
		_, err := ParseFields(in)
		assert.Error(t, err, "input %q", in)
	}
}

func TestParseResults(t *testing.T) {
	port := strings.Join([]string{
		"hpcvmm-result l1=started uptime=2.47 profile=basic",
		"hpcvmm-result test=TestBoot status=run",
		"hpcvmm-result test=TestBoot/cpus=4 key=cpus_online value=4",
		"hpcvmm-result test=TestBoot/cpus=4 key=cpus_online value=5", // later wins, order kept
		"hpcvmm-result test=TestBoot status=fail\r",                  // tty line ending
		"hpcvmm-result test=TestOther status=skip reason=\"no edu device\"",
		"hpcvmm-result test=TestHung status=run",
		"",
		"hpcvmm-result bogus",
		"hpcvmm-resultx test=A status=pass", // not our prefix
		"hpcvmm-result l1=exit code=1",
	}, "\n")
	res, err := ParseResults(strings.NewReader(port))
	require.NoError(t, err)
	assert.Equal(t, StatusFail, res.Tests["TestBoot"].Status)
	assert.Equal(t, "5", res.Tests["TestBoot/cpus=4"].Values["cpus_online"])
	assert.Equal(t, []string{"cpus_online"}, res.Tests["TestBoot/cpus=4"].Keys)
	assert.Equal(t, StatusSkip, res.Tests["TestOther"].Status)
	assert.Equal(t, "no edu device", res.Tests["TestOther"].Reason)
	assert.Equal(t, "TestHung", res.LastStarted)
	assert.Equal(t, "1", res.L1["exit"]["code"])
	assert.Equal(t, "basic", res.L1["started"]["profile"])
	assert.Equal(t, []string{"hpcvmm-result bogus"}, res.Malformed)
	require.Len(t, res.Children("TestBoot"), 1)
	assert.Equal(t, "TestBoot/cpus=4", res.Children("TestBoot")[0].Name)
	assert.Empty(t, res.Children("TestBoot/cpus=4"))
}

func TestParseGuestResults(t *testing.T) {
	console := "[    1.0] random kernel line hpcvmm-guest x=1\r\n" +
		"HPCVMM-GUEST-MARKER init-started\r\n" +
		"hpcvmm-guest cpus_online=4 cpus_online_list=0-3\r\n" +
		"hpcvmm-guest memtotal_kib=466148\r\n" +
		"hpcvmm-guest broken\r\n" +
		"hpcvmm-guest cpus_online=3\r\n"
	vals, bad := ParseGuestResults(console)
	assert.Equal(t, map[string]string{"cpus_online": "3", "cpus_online_list": "0-3", "memtotal_kib": "466148"}, vals)
	assert.Equal(t, []string{"hpcvmm-guest broken\r"}, bad)
}

func TestTestBlock(t *testing.T) {
	console := strings.Join([]string{
		"[ 3.0] boot noise",
		"=== RUN   TestA",
		"    a_test.go:1: hello",
		"--- PASS: TestA (0.01s)",
		"=== RUN   TestAB",
		"=== RUN   TestAB/sub",
		"    --- FAIL: TestAB/sub (0.00s)",
		"--- FAIL: TestAB (0.02s)",
		"=== RUN   TestHang",
		"    still running",
	}, "\r\n")
	assert.Equal(t, "=== RUN   TestA\r\n    a_test.go:1: hello\r\n--- PASS: TestA (0.01s)\r", TestBlock(console, "TestA"))
	assert.Contains(t, TestBlock(console, "TestAB"), "--- FAIL: TestAB/sub")
	assert.True(t, strings.HasSuffix(TestBlock(console, "TestAB"), "--- FAIL: TestAB (0.02s)\r"))
	assert.Equal(t, "=== RUN   TestHang\r\n    still running", TestBlock(console, "TestHang"))
	assert.Empty(t, TestBlock(console, "TestNever"))
}

func TestTail(t *testing.T) {
	assert.Equal(t, "c\nd", Tail("a\nb\nc\nd\n", 2))
	assert.Equal(t, "a", Tail("a", 5))
}

// FuzzParseFields: guest consoles and the result port are written by code
// under test; parsing must never panic, and whatever FormatFields writes
// must parse back unchanged.
func FuzzParseFields(f *testing.F) {
	f.Add("k=v", "value with spaces")
	f.Add(`k="q\"x"`, "")
	f.Add("a=b c=\"d e\"", "\x00\xff=")
	f.Fuzz(func(t *testing.T, line, value string) {
		_, _ = ParseFields(line)
		_, _ = ParseGuestResults(line)
		_, _ = ParseResults(strings.NewReader(ResultPrefix + " " + line))
		in := []Field{{"key", value}}
		out, err := ParseFields(FormatFields(in...))
		if err != nil {
			t.Fatalf("FormatFields(%q) does not parse: %v", value, err)
		}
		if len(out) != 1 || out[0] != in[0] {
			t.Fatalf("round trip of %q gave %q", value, out)
		}
	})
}
