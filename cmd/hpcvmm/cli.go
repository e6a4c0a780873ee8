package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// command is one hpcvmm subcommand: its flags, parsed by pflag, and its
// help, which lists them under headings in the order users look for them.
// Each heading is a pflag set of its own, merged into the parsing set by
// done, so a flag cannot be parsed without being listed (hidden test-only
// flags aside, which go straight into the parsing set).
type command struct {
	name     string   // "hpcvmm run"
	synopsis []string // usage lines, without "hpcvmm"
	summary  string
	footer   string // after the flags: notes, exit status
	groups   []flagGroup
	fs       *pflag.FlagSet
}

type flagGroup struct {
	title string
	fs    *pflag.FlagSet
}

func newCommand(name, summary string, synopsis ...string) *command {
	c := &command{name: name, summary: summary, synopsis: synopsis, fs: newFlagSet(name)}
	return c
}

// newFlagSet returns a set that reports errors to its caller only: pflag's
// own printing would add a full usage dump to every mistake.
func newFlagSet(name string) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.SortFlags = false
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
}

// group starts a heading of --help; the flags defined on the returned set
// are listed under it, in definition order.
func (c *command) group(title string) *pflag.FlagSet {
	fs := newFlagSet(title)
	c.groups = append(c.groups, flagGroup{title: title, fs: fs})
	return fs
}

// hidden defines test-only flags: parsed, never listed.
func (c *command) hidden(define func(fs *pflag.FlagSet)) {
	fs := newFlagSet("hidden")
	define(fs)
	fs.VisitAll(func(f *pflag.Flag) { f.Hidden = true })
	c.fs.AddFlagSet(fs)
}

// done merges the groups into the parsing set and adds -h/--help.
func (c *command) done() *command {
	for _, g := range c.groups {
		c.fs.AddFlagSet(g.fs)
	}
	other := c.group("Other")
	other.BoolP("help", "h", false, "show this help and exit")
	c.fs.AddFlagSet(other)
	return c
}

// parse parses args. It returns -1 to go on, or the exit status: 0 after
// --help printed the help to stdout, 2 after a one-line error on stderr.
func (c *command) parse(args []string, stdout, stderr io.Writer) int {
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "-h" || a == "--help" {
			// Help wins wherever it is, even after a bad flag.
			c.printHelp(stdout)
			return 0
		}
	}
	if err := c.fs.Parse(args); err != nil {
		return c.usageError(stderr, "%s", flagError(c.fs, err))
	}
	return -1
}

// usageError prints one line: the command, what is wrong, and where the
// flags are described. It returns 2, the exit status of invalid input.
func (c *command) usageError(stderr io.Writer, format string, args ...any) int {
	fmt.Fprintf(stderr, "%s: %s (see %s --help)\n", c.name, fmt.Sprintf(format, args...), c.name)
	return 2
}

// noArgs rejects positional arguments, for commands that take none.
func (c *command) noArgs(stderr io.Writer, hint string) int {
	if c.fs.NArg() == 0 {
		return -1
	}
	a := c.fs.Arg(0)
	if a == "true" || a == "false" {
		hint = "a true/false flag takes its value after '=', e.g. --p2p=false"
	}
	if hint != "" {
		return c.usageError(stderr, "unexpected argument %q: %s", a, hint)
	}
	return c.usageError(stderr, "unexpected argument %q", a)
}

// flagError rewords pflag's errors into one clause that names the flag as
// the user must type it.
func flagError(fs *pflag.FlagSet, err error) string {
	var inv *pflag.InvalidValueError
	var missing *pflag.NotExistError
	var needs *pflag.ValueRequiredError
	switch {
	case errors.As(err, &inv):
		cause := errors.Unwrap(inv)
		if strings.Contains(cause.Error(), strconv.Quote(inv.GetValue())) {
			return fmt.Sprintf("--%s: %v", inv.GetFlag().Name, cause) // the cause quotes the value already
		}
		return fmt.Sprintf("--%s %q: %v", inv.GetFlag().Name, inv.GetValue(), cause)
	case errors.As(err, &missing):
		if short := missing.GetSpecifiedShortnames(); short != "" {
			// "-net": pflag reads it as the letters n, e, t.
			name, _, _ := strings.Cut(short, "=")
			if len(name) > 1 && fs.Lookup(name) != nil {
				return fmt.Sprintf("unknown flag -%s: flags take two dashes, --%s", name, name)
			}
			return fmt.Sprintf("unknown flag -%s", name)
		}
		return fmt.Sprintf("unknown flag --%s", missing.GetSpecifiedName())
	case errors.As(err, &needs):
		return fmt.Sprintf("--%s needs a value", needs.GetFlag().Name)
	}
	return err.Error()
}

// helpWidth is the width --help wraps to: a terminal's default.
const helpWidth = 80

// printHelp prints the synopsis, the summary, each group's flags and the
// footer.
func (c *command) printHelp(w io.Writer) {
	var b strings.Builder
	for i, s := range c.synopsis {
		if i == 0 {
			fmt.Fprintf(&b, "usage: %s\n", s)
		} else {
			// Continuation lines line up under the first flag.
			fmt.Fprintf(&b, "%*s%s\n", len("usage: ")+len(c.name)+1, "", s)
		}
	}
	if c.summary != "" {
		fmt.Fprintf(&b, "\n%s\n", wrapText(c.summary, 0, helpWidth))
	}
	type row struct{ left, text string }
	var rows [][]row
	col := 0
	for _, g := range c.groups {
		var rs []row
		g.fs.VisitAll(func(f *pflag.Flag) {
			if f.Hidden {
				return
			}
			left := "  --" + f.Name
			if f.Shorthand != "" {
				left = "  -" + f.Shorthand + ", --" + f.Name
			}
			name, usage := flagPlaceholder(f)
			if name != "" && f.Value.Type() != "bool" {
				left += " " + name
			}
			switch f.DefValue {
			case "", "false", "[]", "0":
			default:
				usage += " (default " + f.DefValue + ")"
			}
			rs = append(rs, row{left, usage})
			if len(left) <= 28 {
				col = max(col, len(left))
			}
		})
		rows = append(rows, rs)
	}
	col += 2
	for i, g := range c.groups {
		if len(rows[i]) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s:\n", g.title)
		for _, r := range rows[i] {
			if len(r.left)+2 > col {
				fmt.Fprintf(&b, "%s\n%s%s\n", r.left, strings.Repeat(" ", col), wrapText(r.text, col, helpWidth))
			} else {
				fmt.Fprintf(&b, "%-*s%s\n", col, r.left, wrapText(r.text, col, helpWidth))
			}
		}
	}
	if c.footer != "" {
		fmt.Fprintf(&b, "\n%s\n", c.footer)
	}
	_, _ = io.WriteString(w, b.String())
}

// flagPlaceholder returns the placeholder for f's value in --help and the
// usage text without it. A usage that starts with "`NAME`: " names it (the
// form used here, since pflag's inline backquotes would repeat it in the
// text); otherwise pflag's rules apply: a backquoted word, or the type.
func flagPlaceholder(f *pflag.Flag) (name, usage string) {
	if rest, ok := strings.CutPrefix(f.Usage, "`"); ok {
		if n, text, ok := strings.Cut(rest, "`: "); ok {
			return n, text
		}
	}
	return pflag.UnquoteUsage(f)
}

// wrapText breaks s into lines of at most width columns, the lines after
// the first indented by indent (the first is placed by the caller).
func wrapText(s string, indent, width int) string {
	var b strings.Builder
	line := indent
	for i, word := range strings.Fields(s) {
		if i > 0 {
			if line+1+len(word) > width {
				b.WriteString("\n" + strings.Repeat(" ", indent))
				line = indent
			} else {
				b.WriteByte(' ')
				line++
			}
		}
		b.WriteString(word)
		line += len(word)
	}
	return b.String()
}
