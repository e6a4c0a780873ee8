// Command agent is a program of one's own that is its jobs' agent: it
// calls jobrun.Dispatch first thing (TestCheckAgent builds it static).
package main

import (
	"fmt"

	"github.com/hpcvmm/hpcvmm/vmm/jobrun"
)

func main() {
	jobrun.Dispatch()
	fmt.Println("started as itself, not as an agent")
}
