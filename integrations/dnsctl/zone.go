package dnsctl

import (
	"fmt"
	"log/slog"
	"net"

	"github.com/miekg/dns"
)

const soaType = dns.TypeSOA

func dnsFqdn(name string) string { return dns.Fqdn(name) }

// soaOf reads the zone apex and serial from a reply to an SOA query: the
// SOA record in the answer (the name is the apex) or in the authority
// section (the name is inside the zone).
func soaOf(reply []byte) (string, uint32, error) {
	var m dns.Msg
	if err := m.Unpack(reply); err != nil {
		return "", 0, err
	}
	if m.Rcode != dns.RcodeSuccess && m.Rcode != dns.RcodeNameError {
		return "", 0, fmt.Errorf("SOA query answered %s", dns.RcodeToString[m.Rcode])
	}
	for _, section := range [][]dns.RR{m.Answer, m.Ns} {
		for _, rr := range section {
			if soa, ok := rr.(*dns.SOA); ok {
				return canonical(soa.Hdr.Name), soa.Serial, nil
			}
		}
	}
	return "", 0, fmt.Errorf("no SOA record in the reply")
}

// pollAll checks the serial of every zone a rule is in.
func (c *Controller) pollAll() error {
	for _, z := range c.zones {
		if err := c.checkZone(z); err != nil {
			return err
		}
	}
	return nil
}

// pollZone asks for z's serial; it reports whether the serial changed
// since the last poll that got an answer.
func (c *Controller) pollZone(ep *endpoint, z *zone) (changed bool) {
	wire, err := Shape{}.Query(0, z.apex, soaType)
	if err != nil {
		return false
	}
	reply, err := c.ask(ep, wire)
	if err == nil {
		var apex string
		var serial uint32
		if apex, serial, err = soaOf(reply); err == nil && apex == z.apex {
			changed = z.known && serial != z.serial
			if changed {
				c.log.Info("zone changed", "zone", z.apex, "serial", serial, "was", z.serial)
			}
			z.serial, z.known = serial, true
			return changed
		}
	}
	c.log.Debug("SOA poll failed", "zone", z.apex, "server", ep.addr, "error", err)
	return false
}

// checkZone polls z and, if its serial changed, asks again for the answer
// of every rule in it.
func (c *Controller) checkZone(z *zone) error {
	if len(c.eps) == 0 || !c.pollZone(c.eps[0], z) {
		return nil
	}
	var stale []*entry
	for _, ep := range c.eps {
		for _, e := range ep.entries {
			if c.zoneOf[canonical(e.question.Name)] == z.apex {
				stale = append(stale, e)
			}
		}
	}
	return c.refresh(stale)
}

// listenNotify accepts DNS NOTIFY messages (RFC 1996) on addr, answers
// them and sends the zone's name to notified. It returns a stop function.
func listenNotify(addr string, notified chan<- string, log *slog.Logger) (func(), error) {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for NOTIFY on %s: %w", addr, err)
	}
	log.Info("accepting NOTIFY", "address", pc.LocalAddr())
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return // closed
			}
			var m dns.Msg
			if m.Unpack(buf[:n]) != nil || m.Response || m.Opcode != dns.OpcodeNotify || len(m.Question) != 1 {
				continue
			}
			r := new(dns.Msg)
			r.SetReply(&m)
			r.Authoritative = true
			if out, err := r.Pack(); err == nil {
				_, _ = pc.WriteTo(out, from)
			}
			log.Info("NOTIFY", "zone", m.Question[0].Name, "from", from)
			select {
			case notified <- m.Question[0].Name:
			default: // a check is queued already
			}
		}
	}()
	return func() { pc.Close() }, nil
}
