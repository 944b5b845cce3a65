package follow

import (
	"fmt"
	"log/slog"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
)

// Inherited are the rules with a controller's tag that its sockets held
// when it started: what a predecessor left (one that was killed, or that
// ended while santad was away; santad restores rules with their tags).
// Left alone they would answer beside the new controller's rules until they
// expire, winning as the older ones with what they answered before, and
// the new controller would not know them. So the controller supersedes
// each one it installs again, deleting it just before adding its own (the
// two never answer side by side, and the request goes to the server for
// that moment), and deletes the rest once its first rules are in.
type Inherited struct {
	tag    string
	rules  map[uint64]map[string][]uint64 // socket cookie -> api.Rule.MatchKey -> ids
	listed map[uint64][]api.Rule          // socket cookie -> the rules as listed
	log    *slog.Logger
}

// Inherit lists the rules tagged tag on each socket in cookies, over a
// connection of its own to santad at socketPath. A socket whose rules
// cannot be listed is left out with a warning: its predecessor's rules
// then answer until they expire or are removed by hand (santa rules rm
// --tag).
func Inherit(socketPath, tag string, cookies []uint64, log *slog.Logger) (*Inherited, error) {
	in := &Inherited{tag: tag, rules: map[uint64]map[string][]uint64{}, listed: map[uint64][]api.Rule{}, log: log}
	var c *santa.Client
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	for _, cookie := range cookies {
		if c == nil {
			var err error
			if c, err = santa.Dial(socketPath); err != nil {
				return nil, err
			}
		}
		rules, err := c.ListTagged(santa.Cookie(cookie), tag)
		if err != nil {
			log.Warn("cannot list the rules of a socket: rules a predecessor left there are not taken over",
				"socket", cookie, "tag", tag, "error", err)
			c.Close() // the connection may be broken: the next socket gets a new one
			c = nil
			continue
		}
		byKey := map[string][]uint64{}
		for _, r := range rules {
			k := r.MatchKey()
			byKey[k] = append(byKey[k], r.ID)
		}
		in.rules[cookie], in.listed[cookie] = byKey, rules
	}
	if n := countRules(in.listed); n > 0 {
		log.Info("taking over the rules a predecessor left", "tag", tag, "rules", n)
	}
	return in, nil
}

// Rules are the inherited rules of socket cookie as listed at the start:
// what a controller may install again, e.g. the questions a DNS
// controller had learned.
func (in *Inherited) Rules(cookie uint64) []api.Rule { return in.listed[cookie] }

// Supersede deletes the inherited rules of socket cookie that match what
// one of rules matches, which the caller is about to add there.
func (in *Inherited) Supersede(c RuleClient, cookie uint64, rules []api.Rule) error {
	byKey := in.rules[cookie]
	if len(byKey) == 0 {
		return nil
	}
	var ids []uint64
	for _, r := range rules {
		k := r.MatchKey()
		ids = append(ids, byKey[k]...)
		delete(byKey, k)
	}
	if len(ids) == 0 {
		return nil
	}
	return DeleteRules(c, cookie, ids)
}

// countRules counts the rules of every socket.
func countRules[R any](bySocket map[uint64][]R) int {
	n := 0
	for _, rules := range bySocket {
		n += len(rules)
	}
	return n
}

// deleteBatch is how many rules one delete request of DeleteRest carries.
const deleteBatch = 1024

// DeleteRest deletes every inherited rule not superseded yet.
func (in *Inherited) DeleteRest(c *santa.Client) error {
	in.listed = nil
	rest := map[uint64][]uint64{}
	for cookie, byKey := range in.rules {
		for _, ids := range byKey {
			rest[cookie] = append(rest[cookie], ids...)
		}
	}
	n := countRules(rest)
	if n == 0 {
		return nil
	}
	for cookie, ids := range rest {
		for i := 0; i < len(ids); i += deleteBatch {
			if err := DeleteRules(c, cookie, ids[i:min(i+deleteBatch, len(ids))]); err != nil {
				return fmt.Errorf("delete the rules of socket %d a predecessor left: %w", cookie, err)
			}
		}
		delete(in.rules, cookie)
	}
	in.log.Info("deleted the rules a predecessor left that this run did not install again", "tag", in.tag, "rules", n)
	return nil
}
