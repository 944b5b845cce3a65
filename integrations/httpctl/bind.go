package httpctl

import (
	"fmt"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
)

// bindListeners has santad give every TCP listening socket bound to port
// (every process, IPv4 and IPv6, every SO_REUSEPORT member) a rule set and
// returns them. It is the controller's only call that depends on santad's
// TCP support.
func bindListeners(c *santa.Client, port uint16) ([]api.SocketInfo, error) {
	socks, err := c.BindPortProtocol(port, api.ProtocolTCP, santa.SampleOptions{})
	if err != nil {
		return nil, fmt.Errorf("attach to the TCP listeners of port %d: %w", port, err)
	}
	var out []api.SocketInfo
	for _, s := range socks {
		if s.Protocol == api.ProtocolTCP {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no TCP socket listens on port %d (is nginx running in this network namespace?)", port)
	}
	return out, nil
}
