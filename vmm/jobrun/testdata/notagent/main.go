// Command notagent is a static program that does not dispatch on
// argv[0]: TestCheckAgent's program that initramfs.CheckAgent accepts and
// jobrun.CheckAgent must refuse.
package main

import "fmt"

func main() {
	fmt.Println("hello")
}
