#!/usr/bin/env bash
# Runs every fuzz target of the module for a short fixed time, one at a
# time (go test -fuzz takes exactly one target per package run), so a
# harness that crashes, fails its assertions or no longer builds fails the
# build. Targets are discovered with `go test -list`, so a new one is run
# without touching this script.
#
#   bash tests/fuzz.sh [fuzztime]      # default 10s per target
#   FUZZ_FILTER=pci bash tests/fuzz.sh  # only packages whose path matches
#   FUZZ_MINIMIZE=60s bash tests/fuzz.sh # go's default minimization budget
#
# Each run's exec count and rate are printed from go test's last progress
# line, so a harness that became slow shows up in the CI log.
set -euo pipefail
cd "$(dirname "$0")/.."

fuzztime=${1:-10s}
# Minimizing each new interesting input (default: up to 60 s each, execs
# not counted) stalls a short run's workers for most of its time; a crasher
# found here is still minimized for this long.
minimize=${FUZZ_MINIMIZE:-2s}
filter=${FUZZ_FILTER:-}
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# `go test -list` prints the matching names, then "ok <pkg> <time>".
targets=() names=()
listing=$(go test -list '^Fuzz' ./... 2>&1) || {
	echo "fuzz: go test -list failed:" >&2
	echo "$listing" >&2
	exit 1
}
while read -r line; do
	case $line in
	Fuzz*) names+=("$line") ;;
	ok*)
		pkg=$(awk '{print $2}' <<<"$line")
		for n in "${names[@]}"; do targets+=("$pkg $n"); done
		names=()
		;;
	esac
done <<<"$listing"

if ((${#targets[@]} == 0)); then
	echo "fuzz: no fuzz targets found (go test -list failed?)" >&2
	exit 1
fi

# corpus_files PKG NAME: the files in the target's corpus directory, one per line.
corpus_files() {
	local dir
	dir=$(go list -f '{{.Dir}}' "$1")/testdata/fuzz/$2
	[[ -d $dir ]] && ls -1 "$dir" || true
}

# deadline_race LOG: the run failed only because Go's fuzz coordinator lost
# its own race at the end of -fuzztime (go.dev/issue/75804, fixed in Go 1.27,
# not in 1.26.x): "context deadline exceeded" is the failure's only reason and
# no target assertion, panic or failing input was reported.
deadline_race() {
	grep -q '^    context deadline exceeded$' "$1" &&
		! grep -qE 'Failing input|panic:|_test\.go:[0-9]+:|fuzz_test\.go' "$1"
}

# fuzz_once PKG NAME: one fuzzing run, its output into $log.
fuzz_once() {
	go test -run '^$' -fuzz "^${2}\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" "$1" >"$log" 2>&1
}

# rate_of LOG: execs and average rate from the last progress line
# ("fuzz: elapsed: 10s, execs: 123456 (0/sec), ..."; its own rate is the
# last interval's, so average over the whole run).
rate_of() {
	grep -o 'elapsed: [0-9]*s, execs: [0-9]*' "$1" | tail -1 |
		awk '{s=$2+0; if (s>0) printf "%d execs in %ds, %d/s", $4, s, $4/s}' || true
}

failed=()
for t in "${targets[@]}"; do
	read -r pkg name <<<"$t"
	[[ -z $filter || $pkg == *"$filter"* ]] || continue
	before=$(corpus_files "$pkg" "$name")
	if fuzz_once "$pkg" "$name"; then
		printf 'ok   %-28s %-40s %s\n' "$name" "$pkg" "$(rate_of "$log")"
		continue
	fi
	# A lost deadline race writes no input and asserts nothing: run the
	# target again rather than fail the build on Go's bug. A second run that
	# fails for any reason, or any run that wrote an input, fails.
	if deadline_race "$log" && [[ $(corpus_files "$pkg" "$name") == "$before" ]]; then
		first=$(rate_of "$log")
		if fuzz_once "$pkg" "$name"; then
			printf 'ok   %-28s %-40s %s (first run: %s, then go.dev/issue/75804 deadline race, no input failed)\n' \
				"$name" "$pkg" "$(rate_of "$log")" "$first"
			continue
		fi
	fi
	printf 'FAIL %-28s %s\n' "$name" "$pkg"
	cat "$log"
	failed+=("$name")
done

if ((${#failed[@]} > 0)); then
	echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
	echo "fuzz: a crasher was written to the package's testdata/fuzz/<target>/; commit it as a regression seed once fixed" >&2
	exit 1
fi
