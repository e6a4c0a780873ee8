package jobrun

import (
	"bytes"
	"io"
	"strings"
	"sync"
)

// consoleWatch passes the guest console on (to stderr, or nowhere with
// --quiet) and keeps its last notable line: the agent's own reason when it
// could not reach hpcvmm ("hpcvmm-agent: ...") or the kernel's panic. A job
// that ends without a status then gets that line as its one-line reason
// instead of a pointer to the console. Only a notable line allocates.
type consoleWatch struct {
	w    io.Writer
	mu   sync.Mutex
	line [512]byte
	n    int
	last string
}

func (c *consoleWatch) Write(p []byte) (int, error) {
	c.mu.Lock()
	for _, b := range p {
		switch b {
		case '\n':
			c.check()
			c.n = 0
		case '\r':
		default:
			if c.n < len(c.line) {
				c.line[c.n] = b
				c.n++
			}
		}
	}
	c.mu.Unlock()
	return c.w.Write(p)
}

var (
	agentPrefix = []byte("hpcvmm-agent:")
	panicMark   = []byte("Kernel panic")
)

func (c *consoleWatch) check() {
	l := c.line[:c.n]
	// A kernel line may carry a "[    1.234567] " time stamp.
	if i := bytes.Index(l, agentPrefix); i >= 0 {
		c.last = string(bytes.TrimSpace(l[i:]))
	} else if i := bytes.Index(l, panicMark); i >= 0 {
		c.last = "guest " + strings.ToLower(string(bytes.TrimSpace(l[i:]))[:1]) + string(bytes.TrimSpace(l[i:]))[1:]
	}
}

// Last is the last notable line, "" for none.
func (c *consoleWatch) Last() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}
