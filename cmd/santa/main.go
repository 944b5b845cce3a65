// Command santa is the command line of Santa: it shows santad's state and
// manages rule sets through the control API. See docs/cli.md.
package main

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func main() {
	if err := newRoot(env{stdout: os.Stdout, stderr: os.Stderr, stdin: os.Stdin}).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "santa:", err)
		os.Exit(1)
	}
}

// env is what commands touch outside themselves, so tests can run them.
type env struct {
	stdout, stderr io.Writer
	stdin          io.Reader
}

// globals are the flags every command takes.
type globals struct {
	socketPath string
	json       bool
}

func (g *globals) dial() (*santa.Client, error) { return santa.Dial(g.socketPath) }

func newRoot(e env) *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "santa",
		Short: "Manage Santa's rules: requests answered in XDP without waking the application",
		Long: `santa talks to santad over its control socket. Read commands take --json.
Rule sets are named by socket cookie (see 'santa rules ls'); root may take
over the sockets of a running server with 'santa attach'.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.SetFlagErrorFunc(explainFlagError)
	root.PersistentFlags().StringVar(&g.socketPath, "socket-path", "", "santad control socket (default $SANTA_SOCKET or /run/santa/santa.sock)")
	root.AddCommand(statusCmd(e, g), rulesCmd(e, g), statsCmd(e, g), topCmd(e, g), attachCmd(e, g), detachCmd(e, g), dnsCmd(e, g), memcachedCmd(e, g), httpCmd(e, g))
	return root
}

// readFlag adds --json to a read command.
func readFlag(c *cobra.Command, g *globals) *cobra.Command {
	c.Flags().BoolVar(&g.json, "json", false, "print JSON instead of a table")
	return c
}

// refuseNotPositive refuses the named flags when given as zero, negative
// or empty: the controllers read 0 as "the default", which is not what was
// asked for, and refuse a negative number naming their own settings.
func refuseNotPositive(cmd *cobra.Command, names ...string) error {
	for _, name := range names {
		fl := cmd.Flags().Lookup(name)
		if fl == nil || !fl.Changed {
			continue
		}
		v := fl.Value.String()
		switch {
		case v == "":
			return fmt.Errorf("--%s %q: must not be empty (default %s)", name, v, fl.DefValue)
		case fl.Value.Type() != "string" && (v == "0" || v == "0s" || strings.HasPrefix(v, "-")):
			return fmt.Errorf("--%s %q: must be more than 0 (default %s)", name, v, fl.DefValue)
		}
	}
	return nil
}

// explainFlagError says what a flag takes when its value does not parse:
// pflag's message names the parser ("strconv.ParseUint: parsing "-1":
// invalid syntax").
func explainFlagError(_ *cobra.Command, err error) error {
	var bad *pflag.InvalidValueError
	if !errors.As(err, &bad) {
		return err
	}
	fl := bad.GetFlag()
	want := "see --help"
	switch fl.Value.Type() {
	case "uint32":
		want = fmt.Sprintf("want a whole number from 0 to %d", uint32(math.MaxUint32))
	case "uint64":
		want = fmt.Sprintf("want a whole number from 0 to %d", uint64(math.MaxUint64))
	case "uint16":
		want = fmt.Sprintf("want a whole number from 0 to %d", math.MaxUint16)
	case "int":
		want = "want a whole number"
	case "duration":
		want = "want a duration such as 500ms, 2s or 1m"
	case "bool":
		want = "want true or false"
	}
	return fmt.Errorf("--%s %q: %s (default %s)", fl.Name, bad.GetValue(), want, fl.DefValue)
}
