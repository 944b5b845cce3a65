package daemon_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// TestNotifyReady: started by systemd (Type=notify in dist/santad.service,
// $NOTIFY_SOCKET), santad sends READY=1 once it serves, so that
// `systemctl start santad` returns only then and a `santa status` right
// after it answers; the systemd manager's side is played here.
func TestNotifyReady(t *testing.T) {
	if unit, err := os.ReadFile("../../dist/santad.service"); err != nil || !strings.Contains(string(unit), "\nType=notify\n") {
		t.Errorf("dist/santad.service (%v): want Type=notify, or systemctl start returns before santad serves", err)
	}
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	notify := filepath.Join(t.TempDir(), "notify")
	ready, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notify, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ready.Close()
	t.Setenv("NOTIFY_SOCKET", notify)
	started := make(chan error, 1)
	go func() { started <- sd.Start(context.Background()) }()
	ready.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 256)
	n, err := ready.Read(buf)
	if err != nil || string(buf[:n]) != "READY=1" {
		t.Fatalf("from santad on $NOTIFY_SOCKET: %q (%v), want READY=1", buf[:n], err)
	}
	c, err := santa.Dial(sd.Socket)
	if err == nil {
		_, _, err = c.Health()
		c.Close()
	}
	if err != nil {
		t.Errorf("health right after READY=1: %v", err)
	}
	if err := <-started; err != nil {
		t.Fatal(err)
	}
}
