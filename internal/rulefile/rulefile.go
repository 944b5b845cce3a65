// Package rulefile reads and writes rule files, the JSON or YAML form of
// rules that `santa rules add` and `santa rules replace` take and
// `santa rules ls --json` prints. docs/cli.md describes the format.
package rulefile

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/santa-offload/santa/api"
	"gopkg.in/yaml.v3"
)

// File is a rule file.
type File struct {
	Rules []Rule `json:"rules" yaml:"rules"`
}

// Rule is one rule: conditions on the request, processors writing the reply.
type Rule struct {
	ID         uint64      `json:"id,omitempty" yaml:"id,omitempty"`
	Version    uint32      `json:"version,omitempty" yaml:"version,omitempty"`
	Priority   uint32      `json:"priority,omitempty" yaml:"priority,omitempty"`
	Conditions []Condition `json:"conditions" yaml:"conditions"`
	Processors []Processor `json:"processors" yaml:"processors"`
	ReplyLen   uint32      `json:"reply_len" yaml:"reply_len"`
	MinLen     uint32      `json:"min_len,omitempty" yaml:"min_len,omitempty"` // shortest request answered, 0 = no bound
	MaxLen     uint32      `json:"max_len,omitempty" yaml:"max_len,omitempty"` // longest request answered, 0 = no bound
	Guards     []Guard     `json:"guards,omitempty" yaml:"guards,omitempty"`
	Close      bool        `json:"close,omitempty" yaml:"close,omitempty"`     // TCP only: the reply ends the connection (FIN)
	Expires    uint64      `json:"expires,omitempty" yaml:"expires,omitempty"` // Unix time (s) santad removes the rule at, 0 = never
	Tag        string      `json:"tag,omitempty" yaml:"tag,omitempty"`         // who added the rule
}

// Guard holds while slot Slot of santad's guard map holds Version. Both are
// always written: slot 0 and version 0 are ordinary values.
type Guard struct {
	Slot    uint32 `json:"slot" yaml:"slot"`
	Version uint64 `json:"version" yaml:"version"`
}

// Data is a byte string written as exactly one of text, hex or base64.
type Data struct {
	Text   *string `json:"text,omitempty" yaml:"text,omitempty"`
	Hex    *string `json:"hex,omitempty" yaml:"hex,omitempty"`
	Base64 *string `json:"base64,omitempty" yaml:"base64,omitempty"`
}

// Condition holds when the request carries the data at Offset, in the bits
// set in Mask if given (as many bytes as the data).
type Condition struct {
	Offset uint32 `json:"offset" yaml:"offset"`
	Data   `json:",inline" yaml:",inline"`
	Mask   *Data `json:"mask,omitempty" yaml:"mask,omitempty"`
}

// Processor is exactly one of Put or Copy.
type Processor struct {
	Put  *Put  `json:"put,omitempty" yaml:"put,omitempty"`
	Copy *Copy `json:"copy,omitempty" yaml:"copy,omitempty"`
}

// Put writes the data at reply offset At.
type Put struct {
	At   uint32 `json:"at" yaml:"at"`
	Data `json:",inline" yaml:",inline"`
}

// Copy writes Length request bytes from offset From at reply offset At; with
// a Mask (Length bytes) only the request bits set in it.
type Copy struct {
	At     uint32 `json:"at" yaml:"at"`
	From   uint32 `json:"from" yaml:"from"`
	Length uint32 `json:"length" yaml:"length"`
	Mask   *Data  `json:"mask,omitempty" yaml:"mask,omitempty"`
}

func (d Data) bytes() ([]byte, error) {
	n := 0
	for _, p := range []*string{d.Text, d.Hex, d.Base64} {
		if p != nil {
			n++
		}
	}
	if n != 1 {
		return nil, errors.New("give the bytes as exactly one of text, hex or base64")
	}
	switch {
	case d.Text != nil:
		return []byte(*d.Text), nil
	case d.Hex != nil:
		b, err := hex.DecodeString(*d.Hex)
		if err != nil {
			return nil, fmt.Errorf("hex: %w", err)
		}
		return b, nil
	}
	b, err := base64.StdEncoding.DecodeString(*d.Base64)
	if err != nil {
		return nil, fmt.Errorf("base64: %w", err)
	}
	return b, nil
}

// mask is the bytes of an optional mask, nil without one.
func mask(d *Data) ([]byte, error) {
	if d == nil {
		return nil, nil
	}
	b, err := d.bytes()
	if err != nil {
		return nil, fmt.Errorf("mask: %w", err)
	}
	return b, nil
}

// maskOf writes a mask as hex, nil for none.
func maskOf(b []byte) *Data {
	if len(b) == 0 {
		return nil
	}
	h := hex.EncodeToString(b)
	return &Data{Hex: &h}
}

// dataOf writes b as text if it is printable UTF-8, else as hex.
func dataOf(b []byte) Data {
	printable := utf8.Valid(b)
	for _, r := range string(b) {
		if r < 0x20 || r == 0x7f {
			printable = false
		}
	}
	s := string(b)
	if printable {
		return Data{Text: &s}
	}
	h := hex.EncodeToString(b)
	return Data{Hex: &h}
}

// yamlPlaces names the places of a rule file where the YAML decoder names
// this package's Go types ("field offset not found in type rulefile.Put",
// "cannot unmarshal !!seq into rulefile.File").
var yamlPlaces = func() *strings.Replacer {
	var pairs []string
	for _, p := range [][2]string{
		{"File", "the file (a mapping whose key rules: holds the list of rules)"},
		{"Rule", "a rule (keys: id, priority, conditions, processors, reply_len, min_len, max_len, guards, close, expires, tag)"},
		{"Condition", "a condition (keys: offset, text, hex, base64, mask)"},
		{"Processor", "a processor (keys: put, copy)"},
		{"Put", "a put (keys: at, text, hex, base64)"},
		{"Copy", "a copy (keys: at, from, length, mask)"},
		{"Guard", "a guard (keys: slot, version)"},
		{"Data", "a mask (keys: text, hex, base64)"},
	} {
		pairs = append(pairs, "type rulefile."+p[0], p[1], "into rulefile."+p[0], "into "+p[1],
			"into []rulefile."+p[0], "into a list, each item "+p[1])
	}
	return strings.NewReplacer(pairs...)
}()

var errEmpty = errors.New("the rule file is empty (one without rules is `rules: []`)")

// Parse reads a rule file in JSON or YAML (JSON is YAML too, but JSON is
// parsed strictly as JSON when it starts with '{'). Unknown keys, keys given
// twice and anything after the file's one object or document are errors.
func Parse(data []byte) ([]api.Rule, error) {
	var f File
	t := bytes.TrimSpace(data)
	if len(t) == 0 {
		return nil, errEmpty
	}
	if t[0] == '{' {
		if err := parseJSON(data, &f); err != nil {
			return nil, fmt.Errorf("rule file (JSON), %w", err)
		}
	} else {
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&f); err == io.EOF { // only comments
			return nil, errEmpty
		} else if err != nil {
			return nil, fmt.Errorf("rule file (YAML): %s", yamlPlaces.Replace(err.Error()))
		}
		// the decoder reads one document at a time: a second one would be dropped
		var next yaml.Node
		if err := dec.Decode(&next); err != io.EOF {
			where := ""
			if next.Line > 0 {
				where = fmt.Sprintf(", line %d", next.Line)
			}
			return nil, fmt.Errorf("rule file (YAML)%s: a second document begins (after '---'): a rule file is one document, with all its rules under one rules: key", where)
		}
	}
	// `rules: []` decodes to an empty list; a file without the key (`{}`,
	// `---`, `rules:`) is no request to remove every rule (replace)
	if f.Rules == nil {
		return nil, errors.New("the rule file has no list under rules: (one without rules is `rules: []`)")
	}
	out := make([]api.Rule, len(f.Rules))
	for i, r := range f.Rules {
		ar, err := r.toAPI()
		if err != nil {
			return nil, fmt.Errorf("rule %d: %w", i, err)
		}
		out[i] = ar
	}
	return out, nil
}

// parseJSON decodes a JSON rule file into f. encoding/json alone would
// accept more than one object (reading the first), keys that match only when
// case is ignored ("Rules"), and a key given twice (keeping the last).
func parseJSON(data []byte, f *File) error {
	lineAt := func(off int64) int {
		return 1 + bytes.Count(data[:min(max(off, 0), int64(len(data)))], []byte("\n"))
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(f); err != nil {
		// where: the error's own offset, else where the decoder stopped
		off := dec.InputOffset()
		var syntax *json.SyntaxError
		var typ *json.UnmarshalTypeError
		if errors.As(err, &syntax) {
			off = syntax.Offset
		} else if errors.As(err, &typ) {
			off = typ.Offset
		}
		return fmt.Errorf("line %d: %w", lineAt(off), err)
	}
	end := dec.InputOffset()
	if _, err := dec.Token(); err != io.EOF {
		rest := end + int64(len(data[end:])-len(bytes.TrimLeft(data[end:], " \t\r\n")))
		return fmt.Errorf("line %d: more follows the end of the rule file's object: a rule file is one object, with all its rules under one \"rules\" key", lineAt(rest))
	}
	return checkJSONKeys(json.NewDecoder(bytes.NewReader(data)), lineAt)
}

// jsonKeys is every key of a rule file, exactly as it must be written.
var jsonKeys = func() map[string]bool {
	keys := map[string]bool{}
	seen := map[reflect.Type]bool{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || seen[t] {
			return
		}
		seen[t] = true
		for i := range t.NumField() {
			field := t.Field(i)
			if name, _, _ := strings.Cut(field.Tag.Get("json"), ","); name != "" {
				keys[name] = true
			}
			walk(field.Type)
		}
	}
	walk(reflect.TypeFor[File]())
	return keys
}()

// checkJSONKeys reads the JSON object dec holds, already decoded once, and
// refuses a key that is not written exactly as the rule file's key it
// stands for, or that its object already has. The decode has checked where
// each key may be; this checks how it is written.
func checkJSONKeys(dec *json.Decoder, lineAt func(int64) int) error {
	type object struct {
		keys    map[string]bool
		wantKey bool
	}
	var open []*object // the objects (nil: an array) enclosing the token
	for {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("line %d: %w", lineAt(dec.InputOffset()), err)
		}
		var inside *object
		if len(open) > 0 {
			inside = open[len(open)-1]
		}
		if key, ok := tok.(string); ok && inside != nil && inside.wantKey {
			if !jsonKeys[key] {
				return fmt.Errorf("line %d: unknown key %q (keys are case-sensitive)", lineAt(dec.InputOffset()), key)
			}
			if inside.keys[key] {
				return fmt.Errorf("line %d: key %q given twice in one object", lineAt(dec.InputOffset()), key)
			}
			inside.keys[key] = true
			inside.wantKey = false
			continue
		}
		switch tok {
		case json.Delim('{'):
			open = append(open, &object{keys: map[string]bool{}, wantKey: true})
			continue
		case json.Delim('['):
			open = append(open, nil)
			continue
		case json.Delim('}'), json.Delim(']'):
			open = open[:len(open)-1]
			if len(open) == 0 {
				return nil
			}
			inside = open[len(open)-1]
		}
		if inside != nil { // a value done: its object's next key follows
			inside.wantKey = true
		}
	}
}

func (r Rule) toAPI() (api.Rule, error) {
	out := api.Rule{ID: r.ID, ReplyLen: r.ReplyLen, Priority: r.Priority, MinLen: r.MinLen, MaxLen: r.MaxLen, Close: r.Close,
		Expires: r.Expires, Tag: r.Tag}
	for i, c := range r.Conditions {
		b, err := c.bytes()
		if err != nil {
			return out, fmt.Errorf("condition %d: %w", i, err)
		}
		m, err := mask(c.Mask)
		if err != nil {
			return out, fmt.Errorf("condition %d: %w", i, err)
		}
		out.Conditions = append(out.Conditions, api.Condition{Offset: c.Offset, Pattern: b, Mask: m})
	}
	for i, p := range r.Processors {
		switch {
		case p.Put != nil && p.Copy == nil:
			b, err := p.Put.bytes()
			if err != nil {
				return out, fmt.Errorf("processor %d (put): %w", i, err)
			}
			out.Processors = append(out.Processors, api.Processor{Kind: api.KindPut, ReplyOffset: p.Put.At, Template: b})
		case p.Copy != nil && p.Put == nil:
			m, err := mask(p.Copy.Mask)
			if err != nil {
				return out, fmt.Errorf("processor %d (copy): %w", i, err)
			}
			out.Processors = append(out.Processors, api.Processor{Kind: api.KindCopy, ReplyOffset: p.Copy.At,
				SrcOffset: p.Copy.From, Length: p.Copy.Length, Mask: m})
		default:
			return out, fmt.Errorf("processor %d: give exactly one of put or copy", i)
		}
	}
	for _, g := range r.Guards {
		out.Guards = append(out.Guards, api.Guard(g))
	}
	return out, nil
}

// FromAPI converts rules for printing or saving as a rule file.
func FromAPI(rules []api.Rule) File {
	f := File{Rules: make([]Rule, len(rules))}
	for i, r := range rules {
		fr := Rule{ID: r.ID, Version: r.Version, Priority: r.Priority, ReplyLen: r.ReplyLen, MinLen: r.MinLen, MaxLen: r.MaxLen, Close: r.Close,
			Expires: r.Expires, Tag: r.Tag}
		for _, c := range r.Conditions {
			fr.Conditions = append(fr.Conditions, Condition{Offset: c.Offset, Data: dataOf(c.Pattern), Mask: maskOf(c.Mask)})
		}
		for _, p := range r.Processors {
			if p.Kind == api.KindPut {
				fr.Processors = append(fr.Processors, Processor{Put: &Put{At: p.ReplyOffset, Data: dataOf(p.Template)}})
			} else {
				fr.Processors = append(fr.Processors, Processor{Copy: &Copy{At: p.ReplyOffset, From: p.SrcOffset,
					Length: p.Length, Mask: maskOf(p.Mask)}})
			}
		}
		for _, g := range r.Guards {
			fr.Guards = append(fr.Guards, Guard(g))
		}
		f.Rules[i] = fr
	}
	return f
}
