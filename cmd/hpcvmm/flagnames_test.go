package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/hpcvmm/hpcvmm/vmm"
)

// configFieldsWithoutFlag are the vmm.Config fields hpcvmm run sets itself,
// not from a flag; no validation error names them.
var configFieldsWithoutFlag = map[string]bool{
	"ConsoleRows": true, "ConsoleCols": true, "Stdin": true, "Stdout": true, "Progress": true, "Logger": true, "StartTime": true,
	"ActingFor":    true, // asuser.Acting, not a flag
	"ConsolePorts": true, // the job's streams (hpcvmm run -- COMMAND), not a flag
}

// TestFlagNamesCoverConfig: every vmm.Config field a flag sets has its
// flag in flagNames, so an API error (which names the field) always reads
// as a CLI error naming the flag; and every flag named exists.
func TestFlagNamesCoverConfig(t *testing.T) {
	c, _ := newRunCommand()
	typ := reflect.TypeFor[vmm.Config]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if configFieldsWithoutFlag[f.Name] {
			continue
		}
		flags, ok := flagNames[f.Name]
		if !assert.True(t, ok, "vmm.Config.%s has no flag in flagNames (or add it to configFieldsWithoutFlag)", f.Name) {
			continue
		}
		for _, name := range strings.Split(flags, "/") {
			assert.NotNil(t, c.fs.Lookup(strings.TrimPrefix(name, "--")), "flagNames[%s] = %s: no such flag", f.Name, name)
		}
	}
	for field := range flagNames {
		_, ok := typ.FieldByName(field)
		assert.True(t, ok, "flagNames names %s, which vmm.Config lacks", field)
	}
}
