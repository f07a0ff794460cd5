// wal_bench appends entries to a tidwall/wal log (segment files, fsync per write), reads
// them back, truncates the front half (whole segment files deleted, the first kept one
// rewritten and renamed) and optionally reopens the log and checks what is left.
//
//	wal_bench [--dir /data/wal] [--num N] [--entry_size B] [--segment_size B] [--nosync=1]
//	          [--benchmarks append,read,truncate_front] [--verify=1] [--verify_only=1]
//
// Entry i (1-based) holds bench.Content(i, 0, entry_size). After "truncate_front" the log
// starts at num/2+1. With --verify_only=1 nothing runs: the existing log is opened and
// checked against the state the --benchmarks list leaves.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/tidwall/wal"

	"valet.example/guests/internal/bench"
)

var (
	dir         = flag.String("dir", "/data/wal", "directory of the log's segment files")
	num         = flag.Int("num", 100000, "number of entries")
	entrySize   = flag.Int("entry_size", 100, "bytes per entry")
	segmentSize = flag.Int("segment_size", 1<<20, "bytes per segment file")
	noSync      = flag.Bool("nosync", false, "do not fsync after each write")
	benchmarks  = flag.String("benchmarks", "append,read,truncate_front", "comma-separated workloads")
	verify      = flag.Bool("verify", false, "close, reopen and check every remaining entry at the end")
	verifyOnly  = flag.Bool("verify_only", false, "run nothing: open the existing log and check it")
)

func entry(i uint64) []byte { return bench.Content(i, 0, *entrySize) }

// state is the range of entries the log should hold (empty when last < first).
type state struct{ first, last uint64 }

func (s *state) apply(workload string) {
	switch workload {
	case "append":
		s.first, s.last = 1, uint64(*num)
	case "truncate_front":
		if s.last >= s.first && s.last > 0 {
			s.first = uint64(*num)/2 + 1
		}
	}
}

func open() *wal.Log {
	opts := *wal.DefaultOptions
	opts.NoSync = *noSync
	opts.SegmentSize = *segmentSize
	log, err := wal.Open(*dir, &opts)
	if err != nil {
		bench.Fail("opening the log in "+*dir, err)
	}
	return log
}

func segments() int {
	entries, err := os.ReadDir(*dir)
	if err != nil {
		bench.Fail("listing "+*dir, err)
	}
	return len(entries)
}

func main() {
	flag.Parse()
	if *num < 2 || *entrySize <= 0 || *segmentSize <= 0 {
		bench.Fail("flags", errors.New("--num must be at least 2, sizes positive"))
	}
	var workloads []string
	var want state
	for _, w := range strings.Split(*benchmarks, ",") {
		if w = strings.TrimSpace(w); w == "" {
			continue
		}
		switch w {
		case "append", "read", "truncate_front":
			workloads = append(workloads, w)
			want.apply(w)
		default:
			bench.Fail("--benchmarks", fmt.Errorf("unknown workload %q", w))
		}
	}
	if *verifyOnly {
		check(&want)
		return
	}
	if err := os.RemoveAll(*dir); err != nil {
		bench.Fail("removing the old log", err)
	}
	fmt.Printf("wal: %d entries of %d bytes, %d-byte segments, nosync %v, dir %s\n",
		*num, *entrySize, *segmentSize, *noSync, *dir)
	log := open()
	var have state
	for _, w := range workloads {
		run(log, w, &have)
		have.apply(w)
	}
	if err := log.Close(); err != nil {
		bench.Fail("closing", err)
	}
	if *verify {
		check(&have)
	}
}

func run(log *wal.Log, workload string, have *state) {
	n := uint64(*num)
	switch workload {
	case "append":
		t := bench.Start(workload, *num)
		for i := uint64(1); i <= n; i++ {
			data := entry(i)
			t.Begin()
			err := log.Write(i, data)
			t.Done()
			if err != nil {
				bench.Fail(fmt.Sprintf("append %d", i), err)
			}
		}
		t.Report(fmt.Sprintf("(%d segment files)", segments()))
	case "read":
		t := bench.Start(workload, *num)
		for i := have.first; i <= have.last && have.last > 0; i++ {
			t.Begin()
			data, err := log.Read(i)
			t.Done()
			if err != nil {
				bench.Fail(fmt.Sprintf("read %d", i), err)
			}
			if !bytes.Equal(data, entry(i)) {
				bench.Mismatch("entry %d has wrong contents", i)
			}
		}
		t.Report("")
	case "truncate_front":
		if have.last == 0 {
			bench.Fail("truncate_front", errors.New("needs append first"))
		}
		before := segments()
		t := bench.Start(workload, 1)
		t.Begin()
		err := log.TruncateFront(n/2 + 1)
		t.Done()
		if err != nil {
			bench.Fail("truncate_front", err)
		}
		t.Report(fmt.Sprintf("segment files %d -> %d", before, segments()))
	}
}

// check reopens the log and compares its index range and every entry with want.
func check(want *state) {
	if _, err := os.Stat(*dir); err != nil {
		bench.Fail("verify: the log", err)
	}
	log := open()
	defer log.Close()
	first, err := log.FirstIndex()
	if err != nil {
		bench.Fail("verify: first index", err)
	}
	last, err := log.LastIndex()
	if err != nil {
		bench.Fail("verify: last index", err)
	}
	if first != want.first || last != want.last {
		bench.Mismatch("log holds entries %d..%d, want %d..%d", first, last, want.first, want.last)
	}
	count := 0
	for i := first; i <= last && last > 0; i++ {
		data, err := log.Read(i)
		if err != nil {
			bench.Mismatch("entry %d: %v", i, err)
		}
		if !bytes.Equal(data, entry(i)) {
			bench.Mismatch("entry %d has wrong contents", i)
		}
		count++
	}
	fmt.Printf("verify: %d entries ok (%d..%d)\n", count, first, last)
}
