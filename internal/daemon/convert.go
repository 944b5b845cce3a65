package daemon

import (
	"errors"
	"fmt"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/dataplane"
	"github.com/santa-offload/santa/internal/ruleconv"
)

// apiError is a failure with the protocol status it is reported under.
type apiError struct {
	status api.Status
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func fail(status api.Status, format string, args ...any) error {
	return &apiError{status, fmt.Sprintf(format, args...)}
}

// statusOf maps an error to the status a client sees.
func statusOf(err error) api.Status {
	var ae *apiError
	switch {
	case errors.As(err, &ae):
		return ae.status
	case errors.Is(err, dataplane.ErrInvalidRule):
		return api.StatusInvalid
	case errors.Is(err, dataplane.ErrNotBound):
		return api.StatusNotFound
	case errors.Is(err, dataplane.ErrFull):
		return api.StatusFull
	}
	return api.StatusInternal
}

func toDataplane(rules []api.Rule) []dataplane.Rule {
	out := make([]dataplane.Rule, len(rules))
	for i, r := range rules {
		out[i] = ruleconv.ToDataplane(r)
	}
	return out
}

func fromDataplane(ri dataplane.RuleInfo) api.Rule {
	r := ruleconv.ToAPI(ri.Rule)
	r.ID, r.Version = uint64(ri.ID), ri.Version
	return r
}

// cost is what a rule counts against its owner's byte quota: its patterns
// and masks (copy masks included) and its reply, which the data plane
// stores as a flattened template, or its puts if they overlap and add up to
// more (santad keeps each of them).
func cost(r api.Rule) uint64 {
	var n, puts uint64
	for _, c := range r.Conditions {
		n += uint64(len(c.Pattern) + len(c.Mask))
	}
	for _, p := range r.Processors {
		n += uint64(len(p.Mask))
		puts += uint64(len(p.Template))
	}
	return n + max(uint64(r.ReplyLen), puts)
}

// encodedBound is at least the size of r's encoding in a message: its bytes
// and, generously, the keys and integers around them.
func encodedBound(r api.Rule) int {
	n := 128 + len(r.Tag) + 32*len(r.Guards)
	for _, c := range r.Conditions {
		n += 32 + len(c.Pattern) + len(c.Mask)
	}
	for _, p := range r.Processors {
		n += 64 + len(p.Template) + len(p.Mask)
	}
	return n
}
