package daemon

import (
	"errors"
	"fmt"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/dataplane"
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
		d := dataplane.Rule{ReplyLen: int(r.ReplyLen), Priority: r.Priority}
		for _, c := range r.Conditions {
			d.Conditions = append(d.Conditions, dataplane.Condition{Offset: int(c.Offset), Pattern: c.Pattern})
		}
		for _, p := range r.Processors {
			d.Processors = append(d.Processors, dataplane.Processor{
				Kind: dataplane.ProcessorKind(p.Kind), ReplyOffset: int(p.ReplyOffset),
				Template: p.Template, SrcOffset: int(p.SrcOffset), Length: int(p.Length)})
		}
		out[i] = d
	}
	return out
}

func fromDataplane(ri dataplane.RuleInfo) api.Rule {
	r := api.Rule{ID: uint64(ri.ID), Version: ri.Version, ReplyLen: uint32(ri.Rule.ReplyLen), Priority: ri.Rule.Priority}
	for _, c := range ri.Rule.Conditions {
		r.Conditions = append(r.Conditions, api.Condition{Offset: uint32(c.Offset), Pattern: c.Pattern})
	}
	for _, p := range ri.Rule.Processors {
		r.Processors = append(r.Processors, api.Processor{Kind: uint32(p.Kind), ReplyOffset: uint32(p.ReplyOffset),
			Template: p.Template, SrcOffset: uint32(p.SrcOffset), Length: uint32(p.Length)})
	}
	return r
}

// cost is what a rule counts against its owner's byte quota: its patterns
// and its reply, which the data plane stores as a flattened template.
func cost(r api.Rule) uint64 {
	n := uint64(r.ReplyLen)
	for _, c := range r.Conditions {
		n += uint64(len(c.Pattern))
	}
	return n
}
