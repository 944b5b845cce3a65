package daemon

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// dist/santad.yaml documents the defaults: read, it is DefaultConfig but for
// its example interface.
func TestDistConfigHoldsTheDefaults(t *testing.T) {
	c, err := LoadConfig("../../dist/santad.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := DefaultConfig()
	want.Interfaces = []string{"eth0"}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("dist/santad.yaml reads as\n%+v\nwant the defaults\n%+v", c, want)
	}
}

// An unknown key is named with its place and the keys that place takes,
// not by the Go type behind it.
func TestConfigUnknownKey(t *testing.T) {
	for text, want := range map[string]string{
		"quota:\n  rulez: 5\n":        "line 2: field rulez not found in quota (keys: rules, template_bytes, rulesets, connections, request_bytes)",
		"dataplane:\n  maxrules: 5\n": "field maxrules not found in dataplane (keys: hash_bits, max_rules,",
		"interface: [eth0]\n":         "field interface not found in the file (keys: interfaces, xdp_mode,",
	} {
		path := filepath.Join(t.TempDir(), "santad.yaml")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadConfig(path)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "daemon.") {
			t.Errorf("%q: %v, want an error saying %q", text, err, want)
		}
	}
}

// Validate refuses values that cannot mean anything, naming the key.
func TestConfigValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		change func(*Config)
		want   string
	}{
		"xdp mode":                    {func(c *Config) { c.XDPMode = "fast" }, `xdp_mode "fast"`},
		"log format":                  {func(c *Config) { c.LogFormat = "xml" }, `log_format "xml"`},
		"interface twice":             {func(c *Config) { c.Interfaces = []string{"eth0", "eth1", "eth0"} }, "interface eth0 is given twice"},
		"negative rule limit":         {func(c *Config) { c.MetricsRuleLimit = -5 }, "metrics_rule_limit -5: must be 0"},
		"user port without transport": {func(c *Config) { c.UserPorts = []string{"53"} }, `user_ports "53": want PORT/udp`},
		"user port 0":                 {func(c *Config) { c.UserPorts = []string{"0/udp"} }, `user_ports "0/udp"`},
		"user ports backwards":        {func(c *Config) { c.UserPorts = []string{"90-80/tcp"} }, `user_ports "90-80/tcp"`},
		"user port over 65535":        {func(c *Config) { c.UserPorts = []string{"65536/udp"} }, `user_ports "65536/udp"`},
		"no rules":                    {func(c *Config) { c.Dataplane.MaxRules = 0 }, "dataplane.max_rules 0: must be more than 0 (leave it out for the default, 65536)"},
		"no flows":                    {func(c *Config) { c.Dataplane.TCPFlows = 0 }, "dataplane.tcp_flows 0: must be more than 0"},
		"negative hash bits":          {func(c *Config) { c.Dataplane.HashBits = -1 }, "dataplane.hash_bits -1: must be more than 0"},
		"idle close past the stamps":  {func(c *Config) { c.Dataplane.TCPIdleClose = 130 * time.Second }, "dataplane.tcp_idle_close 2m10s: must be between 0 (never) and 1m50s"},
		"hash bits past 28":           {func(c *Config) { c.Dataplane.HashBits = 40 }, "dataplane.hash_bits 40: must be between 8 and 28"},
		"sample ring of 3 KiB":        {func(c *Config) { c.Dataplane.SampleRingKiB = 3 }, "dataplane.sample_ring_kib 3: must be a power of two"},
		"idle close without a unit":   {func(c *Config) { c.Dataplane.TCPIdleClose = 75 }, "dataplane.tcp_idle_close 75ns: give a duration with its unit"},
	} {
		c := DefaultConfig()
		tc.change(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, tc.want)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
}

// The default quota leaves a user a share of the data plane, not all of it:
// with 100000 rules and 64 MiB, uid nobody filled the 65536 rules of the
// default data plane and root's adds failed (data plane full).
func TestDefaultQuotaLeavesRoom(t *testing.T) {
	c := DefaultConfig()
	if q, room := c.Quota.Rules, uint64(c.Dataplane.MaxRules); q == 0 || q > room/2 {
		t.Errorf("quota.rules %d of dataplane.max_rules %d: one user may take over half", q, room)
	}
	if q, room := c.Quota.TemplateBytes, uint64(c.Dataplane.DataMiB)<<20; q == 0 || q > room/2 {
		t.Errorf("quota.template_bytes %d of dataplane.data_mib %d bytes: one user may take over half", q, room)
	}
	if q, room := c.Quota.Rulesets, uint64(c.Dataplane.MaxRulesets); q == 0 || q > room/2 {
		t.Errorf("quota.rulesets %d of dataplane.max_rulesets %d: one user may take over half", q, room)
	}
}
