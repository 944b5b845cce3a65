package dnsctl

import (
	"strings"
	"testing"
	"time"
)

// New refuses negative durations and counts (a negative interval would make
// the controller's ticker panic) with an error that names them.
func TestNewRefusesNegativeSettings(t *testing.T) {
	base := Config{Port: 53, Mode: Adaptive}
	for _, c := range []struct {
		set  func(*Config)
		want string
	}{
		{func(c *Config) { c.Interval = -time.Second }, "interval -1s"},
		{func(c *Config) { c.Poll = -time.Second }, "poll -1s"},
		{func(c *Config) { c.Idle = -time.Second }, "idle -1s"},
		{func(c *Config) { c.Timeout = -time.Second }, "timeout -1s"},
		{func(c *Config) { c.Parallel = -1 }, "parallel -1"},
		{func(c *Config) { c.MaxRules = -1 }, "max rules -1"},
		{func(c *Config) { c.Batch = -1 }, "batch -1"},
	} {
		cfg := base
		c.set(&cfg)
		if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "negative") {
			t.Errorf("New with %s: %v, want an error naming it as negative", c.want, err)
		}
	}
	if _, err := New(base); err != nil {
		t.Errorf("New(%+v): %v", base, err)
	}
}
