// Package ruleconv converts rules between the control protocol's form
// (package api) and the data plane's (package dataplane), for santad and for
// tools that build rules with the data plane's types.
package ruleconv

import (
	"bytes"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/dataplane"
)

// ToDataplane is r in the data plane's terms; its ID and Version are not part
// of a rule there. The byte strings are shared with r.
func ToDataplane(r api.Rule) dataplane.Rule {
	d := dataplane.Rule{ReplyLen: int(r.ReplyLen), Priority: r.Priority, MinLen: int(r.MinLen), MaxLen: int(r.MaxLen), Close: r.Close,
		Expires: r.Expires}
	for _, c := range r.Conditions {
		d.Conditions = append(d.Conditions, dataplane.Condition{Offset: int(c.Offset), Pattern: c.Pattern, Mask: c.Mask})
	}
	for _, p := range r.Processors {
		d.Processors = append(d.Processors, dataplane.Processor{
			Kind: dataplane.ProcessorKind(p.Kind), ReplyOffset: int(p.ReplyOffset),
			Template: p.Template, SrcOffset: int(p.SrcOffset), Length: int(p.Length), Mask: p.Mask})
	}
	for _, g := range r.Guards {
		d.Guards = append(d.Guards, dataplane.Guard{Slot: g.Slot, Version: g.Version})
	}
	return d
}

// ToAPI is r in the form santad's clients send it, with copies of its byte
// strings (e.g. to install a rule built with the data plane's types through
// santa.Client.Add).
func ToAPI(r dataplane.Rule) api.Rule {
	out := api.Rule{ReplyLen: uint32(r.ReplyLen), Priority: r.Priority, MinLen: uint32(r.MinLen), MaxLen: uint32(r.MaxLen), Close: r.Close,
		Expires: r.Expires}
	for _, c := range r.Conditions {
		out.Conditions = append(out.Conditions, api.Condition{Offset: uint32(c.Offset),
			Pattern: bytes.Clone(c.Pattern), Mask: bytes.Clone(c.Mask)})
	}
	for _, p := range r.Processors {
		out.Processors = append(out.Processors, api.Processor{Kind: uint32(p.Kind), ReplyOffset: uint32(p.ReplyOffset),
			Template: bytes.Clone(p.Template), SrcOffset: uint32(p.SrcOffset), Length: uint32(p.Length), Mask: bytes.Clone(p.Mask)})
	}
	for _, g := range r.Guards {
		out.Guards = append(out.Guards, api.Guard{Slot: g.Slot, Version: g.Version})
	}
	return out
}
