package dnsctl

import "log/slog"

// PollNewZone polls the serial of zone apex twice through asker, as the
// controller polls a zone whose serial it has not learned yet, and says
// whether each poll was taken as a change of the zone.
func PollNewZone(asker *Asker, apex string) (first, second bool) {
	c := &Controller{log: slog.New(slog.DiscardHandler)}
	ep := &endpoint{addr: asker.Server, asker: asker}
	z := &zone{apex: canonical(apex)}
	c.mu.Lock() // as the controller's loop holds it
	defer c.mu.Unlock()
	return c.pollZone(ep, z), c.pollZone(ep, z)
}
