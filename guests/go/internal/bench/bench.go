// Package bench holds what the Go guests share: per-operation timing, db_bench-style
// report lines, deterministic contents and error exits.
package bench

import (
	"fmt"
	"os"
	"sort"
	"time"
)

// ExitMismatch is the exit code when verification finds wrong data.
const ExitMismatch = 2

// Timer collects the duration of every operation of one workload.
type Timer struct {
	name  string
	start time.Time
	last  time.Time
	ops   []time.Duration
}

// Start begins workload name; expect is a capacity hint.
func Start(name string, expect int) *Timer {
	now := time.Now()
	return &Timer{name: name, start: now, last: now, ops: make([]time.Duration, 0, expect)}
}

// Begin marks the start of one operation.
func (t *Timer) Begin() { t.last = time.Now() }

// Done marks the end of the operation begun last.
func (t *Timer) Done() { t.ops = append(t.ops, time.Since(t.last)) }

// Report prints the workload's block: the summary line (with extra appended) and the
// percentiles of the per-operation durations.
func (t *Timer) Report(extra string) {
	elapsed := time.Since(t.start)
	n := len(t.ops)
	if n == 0 {
		n = 1
	}
	micros := float64(elapsed.Nanoseconds()) / 1e3 / float64(n)
	opsPerSec := float64(n) / elapsed.Seconds()
	if extra != "" {
		extra = " " + extra
	}
	fmt.Printf("%-12s : %11.3f micros/op; %.0f ops/sec;%s\n", t.name, micros, opsPerSec, extra)
	if len(t.ops) == 0 {
		return
	}
	sorted := append([]time.Duration(nil), t.ops...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	fmt.Printf("Percentiles (micros): P50: %.2f P99: %.2f P99.9: %.2f P99.99: %.2f\n",
		pct(sorted, 50), pct(sorted, 99), pct(sorted, 99.9), pct(sorted, 99.99))
}

// pct is the exact (nearest-rank) percentile p of sorted durations, in microseconds.
func pct(sorted []time.Duration, p float64) float64 {
	rank := int(float64(len(sorted))*p/100.0+0.999999) - 1
	if rank < 0 {
		rank = 0
	}
	if rank >= len(sorted) {
		rank = len(sorted) - 1
	}
	return float64(sorted[rank].Nanoseconds()) / 1e3
}

// Fail prints err on stderr and exits 1.
func Fail(what string, err error) {
	fmt.Fprintf(os.Stderr, "error: %s: %v\n", what, err)
	os.Exit(1)
}

// Mismatch prints a verification failure on stderr and exits ExitMismatch.
func Mismatch(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "verify failed: "+format+"\n", args...)
	os.Exit(ExitMismatch)
}

// Content returns size bytes determined by (id, gen): a readable header naming both,
// then pseudo-random lowercase letters from a xorshift seeded by them.
func Content(id uint64, gen uint64, size int) []byte {
	out := make([]byte, 0, size)
	out = fmt.Appendf(out, "%d.%d:", id, gen)
	x := id*0x9E3779B97F4A7C15 ^ (gen+1)*0xC2B2AE3D27D4EB4F
	if x == 0 {
		x = 1
	}
	for len(out) < size {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		out = append(out, 'a'+byte(x%26))
	}
	return out[:size]
}

// Perm is a deterministic permutation of 0..n-1 (Fisher-Yates with a fixed xorshift).
func Perm(n int, seed uint64) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	x := seed | 1
	for i := n - 1; i > 0; i-- {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		j := int(x % uint64(i+1))
		p[i], p[j] = p[j], p[i]
	}
	return p
}
