package daemon_test

import (
	"fmt"
	"strings"
	"testing"
)

// TestRepliesInFlightSurviveSmallerFlowTable: a santad restarted with a
// dataplane.tcp_flows smaller than the flows its predecessor holds, yet
// larger than the replies in flight, carries those replies over. Idle
// flows (replies all acked) may go: the connection's next request starts a
// new one, or goes to the kernel. A flow of a reply in flight must not:
// without it a client's retransmitted request is answered anew, the
// reply's first bytes where the client expects the rest.
func TestRepliesInFlightSurviveSmallerFlowTable(t *testing.T) {
	const idle, inFlight, size = 40, 6, 12
	sd := repliesInFlightAcross(t, inFlightRestart{idle: idle, config: fmt.Sprintf("dataplane:\n  tcp_flows: %d\n", size)})
	// every idle flow but the most recent size-inFlight left behind, and said so
	if want := fmt.Sprintf(`flows_left=%d replies_in_flight_left=0 size=%d`, idle+inFlight-size, size); !strings.Contains(sd.Log(), want) {
		t.Errorf("no warning of the flows the smaller table left behind (%s):\n%s", want, sd.Log())
	}
}
