package follow

import (
	"fmt"

	"github.com/santa-offload/santa/api"
)

// HealthClient is what Room needs of a santad client (*santa.Client).
type HealthClient interface {
	Health() (*api.DaemonInfo, map[string]uint64, error)
}

// Room tells a controller when rules have gone from santad since it last
// had no room for one (NoRoom): its own, another program's, or rules that
// expired. What it left to its server for want of room is then worth
// trying again, and until then not: one health request a second while
// something waits, rather than asking the server again (santa dns) or
// fetching values (santa memcached) for rules santad has no room for.
type Room struct {
	seen *api.DaemonInfo // santad's usage at the last refusal or the last room found
}

// Refused notes santad's usage just after it refused a rule for want of
// room.
func (r *Room) Refused(c HealthClient) error {
	info, _, err := c.Health()
	if err != nil {
		return fmt.Errorf("santad's usage after it had no room: %w", err)
	}
	r.seen = info
	return nil
}

// Freed says how many rules fit in santad now (in its data plane, and in
// the caller's quota if it has one) if rules or their bytes went since the
// last look (Refused or Freed), and 0 if none did.
func (r *Room) Freed(c HealthClient) (int, error) {
	info, _, err := c.Health()
	if err != nil {
		return 0, fmt.Errorf("santad's usage while rules wait for room: %w", err)
	}
	seen := r.seen
	r.seen = info
	if seen != nil && info.Rules >= seen.Rules && info.DataBytes >= seen.DataBytes &&
		info.UsedRules >= seen.UsedRules && info.UsedBytes >= seen.UsedBytes {
		return 0, nil
	}
	free := info.MaxRules - min(info.Rules, info.MaxRules)
	if info.QuotaRules > 0 {
		free = min(free, info.QuotaRules-min(info.UsedRules, info.QuotaRules))
	}
	return int(free), nil
}
