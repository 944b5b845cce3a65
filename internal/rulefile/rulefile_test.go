package rulefile

import (
	"encoding/json"
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	"gopkg.in/yaml.v3"
)

const yamlFile = `
rules:
  - priority: 3
    conditions:
      - {offset: 0, text: Hello}
      - {offset: 8, hex: "00ff"}
      - {offset: 10, hex: "0080", mask: {hex: "0f80"}}
    processors:
      - put: {at: 0, base64: Q09NU1lT}
      - copy: {at: 6, from: 5, length: 2}
      - copy: {at: 7, from: 11, length: 1, mask: {base64: AQ==}}
    reply_len: 8
    min_len: 12
    max_len: 512
    guards:
      - {slot: 0, version: 18446744073709551615}
      - {slot: 1048575, version: 3}
    close: true
    expires: 1795000000
    tag: my app
`

var want = []api.Rule{{
	Priority: 3,
	Conditions: []api.Condition{{Offset: 0, Pattern: api.Bytes("Hello")}, {Offset: 8, Pattern: api.Bytes{0, 0xff}},
		{Offset: 10, Pattern: api.Bytes{0, 0x80}, Mask: api.Bytes{0x0f, 0x80}}},
	Processors: []api.Processor{{Kind: api.KindPut, Template: api.Bytes("COMSYS")},
		{Kind: api.KindCopy, ReplyOffset: 6, SrcOffset: 5, Length: 2},
		{Kind: api.KindCopy, ReplyOffset: 7, SrcOffset: 11, Length: 1, Mask: api.Bytes{1}}},
	ReplyLen: 8,
	MinLen:   12,
	MaxLen:   512,
	Guards:   []api.Guard{{Slot: 0, Version: 1<<64 - 1}, {Slot: 1<<20 - 1, Version: 3}},
	Close:    true,
	Expires:  1795000000,
	Tag:      "my app",
}}

func TestParseYAMLAndJSONRoundTrip(t *testing.T) {
	got, err := Parse([]byte(yamlFile))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("YAML parsed to %+v\nwant %+v", got, want)
	}
	js, err := json.Marshal(FromAPI(got))
	if err != nil {
		t.Fatal(err)
	}
	again, err := Parse(js)
	if err != nil {
		t.Fatalf("parse %s: %v", js, err)
	}
	if !reflect.DeepEqual(again, want) {
		t.Fatalf("JSON %s parsed to %+v", js, again)
	}
	if !strings.Contains(string(js), `"text":"Hello"`) || !strings.Contains(string(js), `"hex":"00ff"`) {
		t.Errorf("printable bytes should print as text, others as hex: %s", js)
	}
	if !strings.Contains(string(js), `"mask":{"hex":"0f80"}`) || !strings.Contains(string(js), `"mask":{"hex":"01"}`) {
		t.Errorf("masks should print as hex: %s", js)
	}
	if !strings.Contains(string(js), `"close":true`) {
		t.Errorf("close should print: %s", js)
	}
	if plain, err := json.Marshal(FromAPI([]api.Rule{{ReplyLen: 1}})); err != nil || strings.Contains(string(plain), "close") {
		t.Errorf("a rule without close should not name it: %s (%v)", plain, err)
	}
	if !strings.Contains(string(js), `"guards":[{"slot":0,"version":18446744073709551615},{"slot":1048575,"version":3}]`) {
		t.Errorf("guards should print in full, slot 0 included: %s", js)
	}
	ys, err := yaml.Marshal(FromAPI(got))
	if err != nil {
		t.Fatal(err)
	}
	if again, err := Parse(ys); err != nil || !reflect.DeepEqual(again, want) {
		t.Fatalf("YAML %s parsed to %+v (%v)", ys, again, err)
	}
}

func TestParseErrors(t *testing.T) {
	for file, wantErr := range map[string]string{
		"rules:\n- conditions: [{offset: 0}]\n":                                        "condition 0: give the bytes as exactly one of",
		"rules:\n- conditions: [{offset: 0, text: a, hex: '61'}]\n":                    "exactly one of",
		"rules:\n- conditions: [{offset: 0, hex: 'zz'}]\n":                             "hex",
		"rules:\n- conditions: [{offset: 0, hex: '00', mask: {}}]\n":                   "condition 0: mask: give the bytes as exactly one of",
		"rules:\n- conditions: [{offset: 0, hex: '00', mask: {hex: 'f'}}]\n":           "condition 0: mask: hex",
		"rules:\n- processors: [{copy: {at: 0, from: 0, length: 1, mask: {}}}]\n":      "processor 0 (copy): mask: give the bytes",
		"rules:\n- processors: [{put: {at: 0, text: a}, copy: {at: 0}}]\n":             "processor 0: give exactly one of put or copy",
		"rules:\n- processors: [{}]\n":                                                 "exactly one of put or copy",
		" \n":                                                                          "the rule file is empty",
		"rules:\n- reply: 5\n":                                                         "field reply not found in a rule (keys: id,",
		"- conditions: [{offset: 0, text: a}]\n":                                       "cannot unmarshal !!seq into the file (a mapping whose key rules: holds the list of rules)",
		"rules:\n  conditions: []\n":                                                   "cannot unmarshal !!map into a list, each item a rule (keys: id,",
		"rules:\n- processors: [{put: {offset: 0, text: a}}]\n":                        "field offset not found in a put (keys: at, text, hex, base64)",
		"rules:\n- close: 1\n":                                                         "cannot unmarshal !!int `1` into bool",
		"rules:\n- guards: [{slot: 1, versoin: 2}]\n":                                  "field versoin not found in a guard (keys: slot, version)",
		"rules:\n- guards: [{slot: -1, version: 2}]\n":                                 "cannot unmarshal !!int `-1`",
		`{"rules": [{"guards": [{"slot": 1, "version": 18446744073709551616}]}]}`:      "cannot unmarshal number",
		`{"rules": [{"conditions": [{"offset": 0, "text": "a"}], "bogus": 1}]}`:        "unknown field",
		"{\"rules\": [\n {\"reply_len\": 1,\n  \"bogus\": 1}]}":                        `line 3: json: unknown field "bogus"`,
		"{\"rules\": [\n {\"reply_len\": \"one\"}]}":                                   "line 2: json: cannot unmarshal string",
		"{\"rules\": [\n\n {\"reply_len\" 1}]}":                                        "line 3: invalid character",
		`{"rules": [{"conditions": [{"offset": 0, "base64": "!!"}], "reply_len": 1}]}`: "base64",
		// what encoding/json or the YAML decoder alone would drop or take silently
		"rules: [{reply_len: 1}]\n---\nrules: [{reply_len: 2}]\n":                                  "(YAML), line 2: a second document begins",
		"rules: [{reply_len: 1}]\n---\n":                                                           "a second document begins",
		"{\"rules\": [{\"reply_len\": 1}]}\n{\"rules\": [{\"reply_len\": 2}]}":                     "line 2: more follows the end of the rule file's object",
		"{\"rules\": [{\"reply_len\": 1}]} xyz":                                                    "line 1: more follows the end",
		"{\"rules\": [{\"conditions\": [{\"offset\": 0,\n \"text\": \"J2\", \"text\": \"J3\"}]}]}": `line 2: key "text" given twice in one object`,
		"{\"rules\": [{\"reply_len\": 1, \"reply_len\": 2}]}":                                      `key "reply_len" given twice`,
		"{\"Rules\": [{\"reply_len\": 1}]}":                                                        `line 1: unknown key "Rules" (keys are case-sensitive)`,
		"rules: [{conditions: [{offset: 0, text: J2, text: J3}]}]\n":                               `mapping key "text" already defined`,
		"Rules: []\n": "field Rules not found in the file",

		// no rules: key at all is not `rules: []`: santa rules replace would remove every rule
		"{}":               "no list under rules:",
		"---\n":            "no list under rules:",
		"null\n":           "no list under rules:",
		"rules:\n":         "no list under rules:",
		"rules: ~\n":       "no list under rules:",
		`{"rules": null}`:  "no list under rules:",
		"# no rules yet\n": "the rule file is empty",
	} {
		if _, err := Parse([]byte(file)); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%q: %v, want an error containing %q", file, err, wantErr)
		}
	}
}

// TestParseOneDocument checks that the checks for a second document and for
// how keys are written let every form of one rule file through.
func TestParseOneDocument(t *testing.T) {
	for file, wantText := range map[string]string{
		"---\nrules: [{conditions: [{offset: 0, text: a}]}]\n...\n":                                                       "a",
		"{\n\t\"rules\": [\n\t\t{\"conditions\": [{\"offset\": 0, \"text\": \"a\\/\\u00e9\\ud83d\\ude00\"}]}\n\t]\n}\n\n": "a/é😀",
		`{"rules": [{"conditions": [{"offset": 0, "text": "x"}, {"offset": 1, "text": "y"}]}]}`:                           "x",
	} {
		rules, err := Parse([]byte(file))
		if err != nil || len(rules) != 1 || string(rules[0].Conditions[0].Pattern) != wantText {
			t.Errorf("%q: %+v, %v; want one rule matching %q", file, rules, err, wantText)
		}
	}
}

// TestDocExamples parses the example rule files of docs/cli.md: each must
// be one santad takes, so its expires must lie ahead (by a year, so that the
// test fails before the example goes stale).
func TestDocExamples(t *testing.T) {
	doc, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	examples := regexp.MustCompile("(?s)```(?:yaml|json)\n(.*?)```").FindAllSubmatch(doc, -1)
	if len(examples) == 0 {
		t.Fatal("docs/cli.md has no yaml or json example")
	}
	soon := uint64(time.Now().AddDate(1, 0, 0).Unix())
	for _, ex := range examples {
		rules, err := Parse(ex[1])
		if err != nil {
			t.Errorf("docs/cli.md example %s: %v", ex[1], err)
		}
		for i, r := range rules {
			if r.Expires != 0 && r.Expires < soon {
				t.Errorf("docs/cli.md example, rule %d: expires %d (%s) has passed or will within a year",
					i, r.Expires, time.Unix(int64(r.Expires), 0).UTC().Format(time.DateOnly))
			}
		}
	}
}
