package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// MainWithSanta is the TestMain of a package whose tests run santad and the
// santa CLI: it needs root (need says for what), builds both from the module
// at root into a temporary directory, sets *bin to it and runs the tests.
// It returns the exit code.
func MainWithSanta(m *testing.M, root, need string, bin *string) int {
	if os.Geteuid() != 0 {
		fmt.Fprintf(os.Stderr, "these tests need root (%s)\n", need)
		return 1
	}
	dir, err := os.MkdirTemp("", "santa-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := GoBuild(dir, root, "./cmd/santad", "./cmd/santa"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	*bin = dir
	return m.Run()
}

// StartSantad runs santad (from bin) in the server namespace of tb,
// attached to the server veth, with its pins under bpffs; the test's
// cleanup stops it and runs `santad cleanup`, and on failure logs santad's
// log and those of logs (name: its text). flags go to santad last (e.g.
// --config).
func (tb *Testbed) StartSantad(t *testing.T, bin, bpffs string, logs map[string]func() string, flags ...string) *Santad {
	t.Helper()
	sd := NewSantad(filepath.Join(bin, "santad"), tb.Server.NS, t.TempDir(), bpffs,
		append([]string{"--interface", tb.Server.Dev, "--log-level", "debug"}, flags...)...)
	// registered first: a santad that fails to answer in time still runs
	// and may have pinned its maps
	t.Cleanup(func() {
		if err := errors.Join(sd.Stop(syscall.SIGTERM), sd.Cleanup()); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("santad log:\n%s", sd.Log())
			for name, log := range logs {
				t.Logf("%s:\n%s", name, log())
			}
		}
	})
	if err := sd.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return sd
}
