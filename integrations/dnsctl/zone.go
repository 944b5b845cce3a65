package dnsctl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/miekg/dns"
)

const soaType = dns.TypeSOA

func dnsFqdn(name string) string { return dns.Fqdn(name) }

// soaOf reads the zone apex and serial from a reply to an SOA query: the
// SOA record in the answer (the name is the apex) or, with an empty answer
// section, in the authority section (the name is inside the zone). Two
// replies have no SOA of the name's zone; above is then a name above it
// whose zone is the name's:
//   - a CNAME or DNAME chain from the name (which is then no apex) in the
//     answer section: the name's parent. NSD follows a chain into its
//     other zones and puts the last one's SOA in the authority section;
//   - a referral (the name is at or below a delegation): the parent of
//     the delegation, the owner of the NS records in the authority section.
func soaOf(reply []byte) (apex string, serial uint32, above string, err error) {
	var m dns.Msg
	if err := m.Unpack(reply); err != nil {
		return "", 0, "", err
	}
	if m.Rcode != dns.RcodeSuccess && m.Rcode != dns.RcodeNameError {
		return "", 0, "", fmt.Errorf("SOA query answered %s", dns.RcodeToString[m.Rcode])
	}
	if len(m.Answer) > 0 {
		if soa, ok := m.Answer[0].(*dns.SOA); ok {
			return canonical(soa.Hdr.Name), soa.Serial, "", nil
		}
		above, _ = parentOf(canonical(m.Question[0].Name))
		return "", 0, above, fmt.Errorf("the answer is a %s chain", dns.TypeToString[m.Answer[0].Header().Rrtype])
	}
	for _, rr := range m.Ns {
		if soa, ok := rr.(*dns.SOA); ok {
			return canonical(soa.Hdr.Name), soa.Serial, "", nil
		}
	}
	for _, rr := range m.Ns {
		if ns, ok := rr.(*dns.NS); ok {
			above, _ = parentOf(canonical(ns.Hdr.Name))
			return "", 0, above, fmt.Errorf("a referral to %s", ns.Hdr.Name)
		}
	}
	return "", 0, "", fmt.Errorf("no SOA record in the reply")
}

// parentOf is name (canonical) without its first label; false for the
// root and for "" (no name).
func parentOf(name string) (string, bool) {
	if name == "." || name == "" {
		return "", false
	}
	if off, end := dns.NextLabel(name, 0); !end {
		return name[off:], true
	}
	return ".", true
}

// checkZones makes sure the server answers the SOA of every zone given
// with Zones (when polling or NOTIFY uses them): a wrong one (a zone it
// does not serve, a parent like "com", a name inside a zone) fails the
// start instead of being polled in vain. Each zone is asked for at every
// endpoint, and one that serves it is enough: the port may have the
// sockets of other servers too (a local resolver's). A server that
// answers SERVFAIL (still loading its zones, say) or not at all only gets
// a warning: polling asks again.
func (c *Controller) checkZones() error {
	if c.cfg.Poll == 0 && c.cfg.Notify == "" {
		return nil
	}
	for _, z := range c.cfg.Zones {
		apex := canonical(z)
		wire, err := Shape{}.Query(0, apex, soaType)
		if err != nil {
			return fmt.Errorf("zone %q: %w", z, err)
		}
		var notServed error // the first server's answer that it does not serve the zone
		served := false
		for _, ep := range c.eps {
			reply, err := c.ask(ep, wire)
			var m dns.Msg
			if err == nil {
				err = m.Unpack(reply)
			}
			if err == nil && m.Rcode == dns.RcodeServerFailure {
				err = errors.New("SOA query answered SERVFAIL")
			}
			if err != nil {
				c.log.Warn("cannot check the zone now: polling asks again", "zone", apex, "server", ep.addr, "error", err)
				continue
			}
			if err := zoneServed(apex, &m); err != nil {
				if notServed == nil {
					notServed = fmt.Errorf("zone %s: the server at %v %w (check --zone)", apex, ep.addr, err)
				}
				continue
			}
			served = true
		}
		if !served && notServed != nil {
			return notServed
		}
	}
	return nil
}

// zoneServed returns why m, a reply to an SOA query for apex, shows that
// apex is not a zone the server serves, or nil.
func zoneServed(apex string, m *dns.Msg) error {
	if m.Rcode != dns.RcodeSuccess {
		return fmt.Errorf("answers its SOA query %s: it does not serve that zone", dns.RcodeToString[m.Rcode])
	}
	for _, rr := range m.Answer {
		if soa, ok := rr.(*dns.SOA); ok && canonical(soa.Hdr.Name) == apex {
			return nil
		}
	}
	for _, rr := range m.Ns {
		if soa, ok := rr.(*dns.SOA); ok {
			return fmt.Errorf("answers its SOA query with the SOA of %s: it is a name inside that zone, not a zone apex", canonical(soa.Hdr.Name))
		}
	}
	return errors.New("answers its SOA query without the zone's SOA record (a delegation?): it does not serve that zone")
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

// pollZone asks ep's server for z's serial; it reports whether the serial
// changed since its last answer with one, or is the first one learned, or
// whether the server, answering, no longer gives the zone's SOA (the zone
// was removed, or failed to load): its answers in the zone may have gone
// too.
func (c *Controller) pollZone(ep *endpoint, z *zone) (changed bool) {
	wire, err := Shape{}.Query(0, z.apex, soaType)
	if err != nil {
		return false
	}
	at := z.serialAt(ep)
	reply, err := c.ask(ep, wire)
	answered := err == nil
	if answered {
		var apex string
		var serial uint32
		if apex, serial, _, err = soaOf(reply); err == nil && apex == z.apex {
			// a serial learned only now (the start's poll failed) may be
			// newer than the answers asked for before: take it as a change
			changed = !at.known || serial != at.serial
			if changed {
				c.log.Info("zone changed", "zone", z.apex, "server", ep.addr, "serial", serial, "was", at.serial)
			}
			at.serial, at.known = serial, true
			if at.failing {
				at.failing = false
				c.log.Log(context.Background(), at.outage.ended(), "the server answers the zone's SOA again", "zone", z.apex, "server", ep.addr)
			}
			return changed
		}
		if err == nil {
			err = fmt.Errorf("the SOA in the reply is of %s", apex)
		}
	}
	// once per outage: every poll would flood the log, and ask again
	if at.failing {
		c.log.Debug("SOA poll failed", "zone", z.apex, "server", ep.addr, "error", err)
		return false
	}
	at.failing = true
	if answered {
		at.outage.loud = true // a zone gone is news, however many outages came before
		c.log.Warn("the server no longer answers the zone's SOA: asking again for its answers in the zone", "zone", z.apex, "server", ep.addr, "error", err)
		at.known = false // the zone back, with any serial, is a change
		return true
	}
	c.log.Log(context.Background(), at.outage.began(), "SOA poll failed: changes of the zone go unnoticed until the server answers it", "zone", z.apex, "server", ep.addr, "error", err)
	return false
}

// checkZone polls z at every endpoint and, where its serial changed, asks
// again for the answer of every rule of the endpoint in it, and of every
// query in it whose rule was removed.
func (c *Controller) checkZone(z *zone) error {
	for _, ep := range c.eps {
		if !c.pollZone(ep, z) {
			continue
		}
		var stale []*entry
		for _, e := range ep.entries {
			if c.answersFrom(e, z.apex) {
				stale = append(stale, e)
			}
		}
		// first the queries removed before the change: those refresh
		// removes now were just asked
		if err := c.askAgainInZone(ep, z.apex); err != nil {
			return err
		}
		if err := c.refreshEndpoint(ep, stale); err != nil {
			return err
		}
	}
	return nil
}

// answersFrom reports whether e's answer comes (in part) from the zone
// apex: the zone of its question's name, or of a name its chain leads to.
func (c *Controller) answersFrom(e *entry, apex string) bool {
	if c.zoneOf[canonical(e.question.Name)] == apex {
		return true
	}
	for _, name := range e.answer.Chain {
		if c.zoneOf[name] == apex {
			return true
		}
	}
	return false
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
