// buntdb_bench runs db_bench-style workloads against a buntdb database (an append-only
// file that Shrink rewrites and renames over the old one), then optionally reopens it and
// checks every key.
//
//	buntdb_bench [--dir /data/buntdb] [--num N] [--value_size B] [--sync always|everysecond|never]
//	             [--benchmarks set,update,get,delete,shrink] [--verify=1] [--verify_only=1]
//
// The expected contents follow from --num and the list of workloads: "set" writes every key
// at generation 0, "update" rewrites every key at generation 1, "delete" removes every key
// whose number is a multiple of 4. With --verify_only=1 nothing runs: the existing database
// is opened and checked against the state the --benchmarks list leaves (durability across
// processes).
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/tidwall/buntdb"

	"valet.example/guests/internal/bench"
)

var (
	dir        = flag.String("dir", "/data/buntdb", "directory of the database file")
	num        = flag.Int("num", 10000, "number of keys")
	valueSize  = flag.Int("value_size", 100, "bytes per value")
	syncFlag   = flag.String("sync", "always", "buntdb SyncPolicy: always, everysecond or never")
	benchmarks = flag.String("benchmarks", "set,update,get,delete,shrink", "comma-separated workloads")
	verify     = flag.Bool("verify", false, "close, reopen and check every key at the end")
	verifyOnly = flag.Bool("verify_only", false, "run nothing: open the existing database and check it")
)

func key(i int) string { return fmt.Sprintf("key%016d", i) }

func value(i int, gen uint64) string { return string(bench.Content(uint64(i), gen, *valueSize)) }

func deleted(i int) bool { return i%4 == 0 }

// state is what the database should hold.
type state struct {
	written bool   // keys exist at all
	gen     uint64 // generation of the values
	deleted bool   // multiples of 4 removed
}

func (s *state) apply(workload string) {
	switch workload {
	case "set":
		s.written, s.gen, s.deleted = true, 0, false
	case "update":
		s.gen = 1
	case "delete":
		s.deleted = true
	}
}

func (s *state) expected(i int) (string, bool) {
	if !s.written || (s.deleted && deleted(i)) {
		return "", false
	}
	return value(i, s.gen), true
}

// syncPolicy is --sync as a buntdb.SyncPolicy.
func syncPolicy() buntdb.SyncPolicy {
	switch strings.ToLower(*syncFlag) {
	case "always":
		return buntdb.Always
	case "everysecond":
		return buntdb.EverySecond
	case "never":
		return buntdb.Never
	default:
		bench.Fail("--sync", fmt.Errorf("unknown policy %q (always, everysecond, never)", *syncFlag))
	}
	return buntdb.Never
}

func open(path string) *buntdb.DB {
	db, err := buntdb.Open(path)
	if err != nil {
		bench.Fail("opening "+path, err)
	}
	var config buntdb.Config
	if err := db.ReadConfig(&config); err != nil {
		bench.Fail("reading the config", err)
	}
	config.SyncPolicy = syncPolicy()
	config.AutoShrinkDisabled = true // the shrink workload shrinks, nothing else
	if err := db.SetConfig(config); err != nil {
		bench.Fail("setting the config", err)
	}
	return db
}

func fileSize(path string) int64 {
	info, err := os.Stat(path)
	if err != nil {
		bench.Fail("stat "+path, err)
	}
	return info.Size()
}

func main() {
	flag.Parse()
	if *num <= 0 || *valueSize <= 0 {
		bench.Fail("flags", errors.New("--num and --value_size must be positive"))
	}
	syncPolicy() // fails early on a bad --sync
	path := filepath.Join(*dir, "data.db")
	var workloads []string
	for _, w := range strings.Split(*benchmarks, ",") {
		if w = strings.TrimSpace(w); w != "" {
			workloads = append(workloads, w)
		}
	}
	var want state
	for _, w := range workloads {
		switch w {
		case "set", "update", "get", "delete", "shrink":
			want.apply(w)
		default:
			bench.Fail("--benchmarks", fmt.Errorf("unknown workload %q", w))
		}
	}
	if *verifyOnly {
		check(path, &want)
		return
	}

	if err := os.MkdirAll(*dir, 0o755); err != nil {
		bench.Fail("creating "+*dir, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		bench.Fail("removing the old database", err)
	}
	fmt.Printf("buntdb: %d keys, %d-byte values, sync %s, file %s\n", *num, *valueSize, *syncFlag, path)
	db := open(path)
	var have state
	for _, w := range workloads {
		run(db, w, path, &have)
		have.apply(w)
	}
	if err := db.Close(); err != nil {
		bench.Fail("closing", err)
	}
	if *verify {
		check(path, &have)
	}
}

func run(db *buntdb.DB, workload, path string, have *state) {
	n := *num
	switch workload {
	case "set", "update":
		gen := uint64(0)
		seed := uint64(1)
		if workload == "update" {
			gen, seed = 1, 2
		}
		t := bench.Start(workload, n)
		for _, i := range bench.Perm(n, seed) {
			k, v := key(i), value(i, gen)
			t.Begin()
			err := db.Update(func(tx *buntdb.Tx) error {
				_, _, err := tx.Set(k, v, nil)
				return err
			})
			t.Done()
			if err != nil {
				bench.Fail(workload+" "+k, err)
			}
		}
		t.Report("")
	case "get":
		t := bench.Start(workload, n)
		found := 0
		for _, i := range bench.Perm(n, 3) {
			k := key(i)
			want, exists := have.expected(i)
			var got string
			t.Begin()
			err := db.View(func(tx *buntdb.Tx) error {
				var err error
				got, err = tx.Get(k)
				return err
			})
			t.Done()
			switch {
			case errors.Is(err, buntdb.ErrNotFound) && !exists:
			case err != nil:
				bench.Fail("get "+k, err)
			case !exists || got != want:
				bench.Mismatch("get %s returned a wrong value", k)
			default:
				found++
			}
		}
		t.Report(fmt.Sprintf("(%d of %d found)", found, n))
	case "delete":
		t := bench.Start(workload, n/4+1)
		for _, i := range bench.Perm(n, 4) {
			if !deleted(i) {
				continue
			}
			k := key(i)
			t.Begin()
			err := db.Update(func(tx *buntdb.Tx) error {
				_, err := tx.Delete(k)
				return err
			})
			t.Done()
			if err != nil && !(errors.Is(err, buntdb.ErrNotFound) && !have.written) {
				bench.Fail("delete "+k, err)
			}
		}
		t.Report("")
	case "shrink":
		before := fileSize(path)
		t := bench.Start(workload, 1)
		t.Begin()
		err := db.Shrink()
		t.Done()
		if err != nil {
			bench.Fail("shrink", err)
		}
		// Shrink waits 250 ms before it starts; that is in the time.
		t.Report(fmt.Sprintf("file %d -> %d bytes", before, fileSize(path)))
	}
}

// check reopens the database and compares every key and the count with the expected state.
func check(path string, want *state) {
	if _, err := os.Stat(path); err != nil {
		bench.Fail("verify: the database", err)
	}
	db := open(path)
	defer db.Close()
	expectCount := 0
	err := db.View(func(tx *buntdb.Tx) error {
		for i := 0; i < *num; i++ {
			k := key(i)
			wantValue, exists := want.expected(i)
			got, err := tx.Get(k)
			switch {
			case errors.Is(err, buntdb.ErrNotFound) && !exists:
			case err != nil && exists:
				bench.Mismatch("key %s: %v", k, err)
			case err != nil:
				return err
			case !exists:
				bench.Mismatch("key %s should be gone", k)
			case got != wantValue:
				bench.Mismatch("key %s has a wrong value (%.24q..., want %.24q...)", k, got, wantValue)
			}
			if exists {
				expectCount++
			}
		}
		count, err := tx.Len()
		if err != nil {
			return err
		}
		if count != expectCount {
			bench.Mismatch("%d keys in the database, want %d", count, expectCount)
		}
		return nil
	})
	if err != nil {
		bench.Fail("verify", err)
	}
	fmt.Printf("verify: %d keys ok\n", expectCount)
}
