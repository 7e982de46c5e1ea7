# Stages of a long command and the one summary line it ends with (sourced by scripts/test.sh;
# tested by tests/scripts/stages_test.sh).
#
#   stage NAME CMD...        runs CMD; records "NAME passed" or "NAME FAILED (exit N)"
#   stage_skip NAME WHY      records "NAME not run (WHY)"
#   stage_record NAME OK TEXT   records TEXT for NAME, counting it failed when OK is not 0
#   ctest_counts LOG         "808/808 passed", "806/808 passed, 2 failed: a, b" or
#                            "807/808 passed, 1 skipped: c" from a ctest log ("" when the
#                            log holds no ctest summary); a skipped test never counts passed
#   stages_summary PREFIX    prints "PREFIX: PASSED|FAILED: <each stage>; ... (T min)" and
#                            returns 1 when any stage failed or was not run
# Bash only; the caller keeps `set -u`; a stage's failure never ends the caller (set -e is
# suspended inside stage).

_stage_texts=()
_stage_failed=0
_stage_start=$(date +%s)

stage_record() {  # NAME OK TEXT
  _stage_texts+=("$3")
  [ "$2" -eq 0 ] || _stage_failed=1
}

stage() {  # NAME CMD...
  local name=$1 rc=0
  shift
  "$@" || rc=$?
  if [ "$rc" -eq 0 ]; then
    stage_record "$name" 0 "$name passed"
  else
    stage_record "$name" 1 "$name FAILED (exit $rc)"
  fi
  return 0
}

stage_skip() {  # NAME WHY
  stage_record "$1" 1 "$1 not run ($2)"
}

ctest_counts() {  # LOG
  local line total failed passed names skipped skipped_names text
  line=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$1" | tail -n 1)
  [ -n "$line" ] || return 0
  failed=$(sed -E 's/^[0-9]+% tests passed, ([0-9]+) tests? failed.*/\1/' <<<"$line")
  total=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$line")
  # ctest counts a skipped test (SKIP_RETURN_CODE: the GPU check without a GPU) as passed; it
  # lists them after "The following tests did not run:", one a line:
  #   <tab>  835 - gpu_check (Skipped)
  skipped_names=$(sed -n '/^The following tests did not run:/,/^$/p' "$1" |
                  sed -nE 's/^[[:space:]]*[0-9]+ - ([^ ]+) \(Skipped\).*/\1/p' |
                  paste -sd, - | sed 's/,/, /g')
  skipped=0
  [ -z "$skipped_names" ] || skipped=$(tr ',' '\n' <<<"$skipped_names" | wc -l)
  passed=$((total - failed - skipped))
  text="$passed/$total passed"
  if [ "$failed" -ne 0 ]; then
    # ctest lists the failed tests after "The following tests FAILED:", one a line:
    #   <tab>  12 - name (Failed)
    names=$(sed -n '/^The following tests FAILED:/,$p' "$1" |
            sed -nE 's/^[[:space:]]*[0-9]+ - ([^ ]+) .*/\1/p' | paste -sd, - | sed 's/,/, /g')
    text+=", $failed failed: ${names:-see the log}"
  fi
  [ "$skipped" -eq 0 ] || text+=", $skipped skipped: $skipped_names"
  echo "$text"
}

stages_summary() {  # PREFIX
  local verdict=PASSED joined="" t
  [ "$_stage_failed" -eq 0 ] || verdict=FAILED
  for t in "${_stage_texts[@]}"; do
    joined+="${joined:+; }$t"
  done
  local secs=$(( $(date +%s) - _stage_start ))
  echo "$1: $verdict: $joined ($((secs / 60)) min $((secs % 60)) s)"
  [ "$_stage_failed" -eq 0 ]
}
