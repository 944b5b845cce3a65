package daemon_test

import (
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
)

// TestAcceptFailuresBackOff runs santad out of fds with idle connections:
// accept then fails (EMFILE) until one closes, and santad must wait between
// tries rather than spin a CPU and flood its log; once the connections
// close, it serves clients again.
func TestAcceptFailuresBackOff(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	pid := strconv.Itoa(sd.PID())
	fds, err := os.ReadDir("/proc/" + pid + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	limit := strconv.Itoa(len(fds) + 4)
	if out, err := exec.Command("prlimit", "--pid", pid, "--nofile="+limit+":"+limit).CombinedOutput(); err != nil {
		t.Fatalf("prlimit: %v: %s", err, out)
	}
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range 20 { // the ones santad cannot accept wait in the listen backlog
		c, err := net.Dial("unix", sd.Socket)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	time.Sleep(2 * time.Second)
	if n := strings.Count(sd.Log(), "accept failed"); n == 0 || n > 20 {
		t.Errorf("santad logged %d failed accepts in 2 s out of fds, want a few (it retries with pauses)", n)
	}
	for _, c := range idle {
		c.Close()
	}
	idle = nil
	if _, err := sd.cli(0, "status"); err != nil {
		t.Errorf("santad does not serve clients again once the idle connections closed: %v", err)
	}
}
