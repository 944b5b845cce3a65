package dataplane

import "errors"

// Usage is what the installed rules occupy, for health reports and metrics.
type Usage struct {
	Rules        int // installed rules
	Rulesets     int // sockets with rule sets
	DataBytes    int // bytes of patterns, masks and templates in data pages
	MaxDataBytes int
}

// Usage reports the rules installed and the data memory they take.
func (d *Dataplane) Usage() Usage {
	d.mu.Lock()
	defer d.mu.Unlock()
	return Usage{Rules: len(d.byID), Rulesets: len(d.bySocket), DataBytes: d.data.used, MaxDataBytes: d.cfg.DataMiB * pageData}
}

// ErrFull wraps every refusal for lack of room: rules, rule sets or data memory.
var ErrFull = errors.New("data plane full")
