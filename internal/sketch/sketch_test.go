package sketch

import (
	"fmt"
	"strings"
	"testing"
)

func TestSketchFindsHeavyHitters(t *testing.T) {
	s := New(1024)
	// 10 heavy keys among 10000 one-off keys
	for i := 0; i < 10000; i++ {
		s.Add(fmt.Sprintf("noise-%d", i))
		if i%20 == 0 {
			s.Add(fmt.Sprintf("hot-%d", i/20%10))
		}
	}
	hot := s.Hot(20)
	if len(hot) != 10 {
		t.Fatalf("hot keys %v, want the 10 hot ones", hot)
	}
	for _, k := range hot {
		if !strings.HasPrefix(k, "hot-") {
			t.Errorf("%s reported hot", k)
		}
	}
	s.Forget(hot[0])
	if s.Has(hot[0]) || len(s.Hot(20)) != 9 {
		t.Errorf("Forget did not drop %s", hot[0])
	}
	for i := 0; i < 10; i++ {
		s.Decay()
	}
	if len(s.Hot(1)) != 0 {
		t.Errorf("counts survived decay: %v", s.Hot(1))
	}
}
