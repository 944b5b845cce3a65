// Command santa is the command line of Santa: it shows santad's state and
// manages rule sets through the control API. See docs/cli.md.
package main

import (
	"fmt"
	"io"
	"os"

	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/spf13/cobra"
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
	root.PersistentFlags().StringVar(&g.socketPath, "socket-path", "", "santad control socket (default $SANTA_SOCKET or /run/santa/santa.sock)")
	root.AddCommand(statusCmd(e, g), rulesCmd(e, g), statsCmd(e, g), topCmd(e, g), attachCmd(e, g), detachCmd(e, g), dnsCmd(e, g), memcachedCmd(e, g), httpCmd(e, g))
	return root
}

// readFlag adds --json to a read command.
func readFlag(c *cobra.Command, g *globals) *cobra.Command {
	c.Flags().BoolVar(&g.json, "json", false, "print JSON instead of a table")
	return c
}

// refuseZero refuses the named flags when given as zero or empty: the
// controllers read 0 as "the default", which is not what was asked for.
func refuseZero(cmd *cobra.Command, names ...string) error {
	for _, name := range names {
		fl := cmd.Flags().Lookup(name)
		if fl == nil || !fl.Changed {
			continue
		}
		switch v := fl.Value.String(); v {
		case "":
			return fmt.Errorf("--%s %q: must not be empty (default %s)", name, v, fl.DefValue)
		case "0", "0s":
			return fmt.Errorf("--%s %q: must be more than 0 (default %s)", name, v, fl.DefValue)
		}
	}
	return nil
}
