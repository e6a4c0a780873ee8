package agent

import (
	"encoding/binary"
	"os"
	"path/filepath"
)

// Input event constants (linux/input-event-codes.h).
const (
	evKey    = 0x01
	keyPower = 116
	// inputEventSize is struct input_event on 64-bit Linux: a 16-byte
	// timeval, u16 type, u16 code, s32 value.
	inputEventSize = 24
)

// isPowerPress reports whether ev (one struct input_event) is KEY_POWER
// pressed.
func isPowerPress(ev []byte) bool {
	if len(ev) < inputEventSize {
		return false
	}
	typ := binary.LittleEndian.Uint16(ev[16:])
	code := binary.LittleEndian.Uint16(ev[18:])
	value := int32(binary.LittleEndian.Uint32(ev[20:]))
	return typ == evKey && code == keyPower && value == 1
}

// watchPowerButton reads every input device under devRoot/input and
// signals pressed (without blocking) for each KEY_POWER press. The ACPI
// power button (hpcvmm's GED event) reaches user space only this way, as
// Linux's acpi button driver turns it into a key.
func watchPowerButton(devRoot string, pressed chan<- struct{}) (opened int) {
	paths, _ := filepath.Glob(filepath.Join(devRoot, "input/event*"))
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		opened++
		go func() {
			defer f.Close()
			buf := make([]byte, inputEventSize*64)
			for {
				n, err := f.Read(buf)
				for off := 0; off+inputEventSize <= n; off += inputEventSize {
					if isPowerPress(buf[off : off+inputEventSize]) {
						select {
						case pressed <- struct{}{}:
						default:
						}
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
	return opened
}
