#!/bin/sh
# ctest's test_completion: the bash and zsh completions of graphd and
# graphctl (packaging/completions) offer what the programs take, so they
# cannot drift from `--help`: graphd's options are exactly those its
# --help lists; graphctl's commands, its options and every command's
# switches are those its --help names, and graphctl accepts each switch
# the completion offers; values are completed for --backend, --log-level
# and --fair-shares. The bash half runs in plain bash (the completions need
# nothing from the bash-completion package); the zsh half needs zsh
# (Debian: zsh) and is skipped, saying so, without it.
# Usage: test_completion.sh GRAPHD GRAPHCTL COMPLETION_DIR
set -u
graphd=$1 graphctl=$2 dir=$(cd "$3" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/graphd-completion-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# same NAME WANT GOT: the two files hold the same words.
same() {
  sort -u "$2" >"$tmp/want"
  sort -u "$3" >"$tmp/got"
  if cmp -s "$tmp/want" "$tmp/got"; then
    echo "ok: $1"
  else
    bad "$1: want (<) and offered (>) differ:"
    diff "$tmp/want" "$tmp/got" | grep '^[<>]'
  fi
}

# What each program's --help names.
"$graphd" --help | sed -n 's/^  \(--[a-z-]*\).*/\1/p' >"$tmp/graphd.opts"
"$graphctl" --help >"$tmp/ctl.help"
sed -n '/^commands:/,/^[A-Z]/s/^  \([a-z][a-z]*\).*/\1/p' "$tmp/ctl.help" >"$tmp/ctl.cmds"
echo help >>"$tmp/ctl.cmds" # `graphctl help` is --help
sed -n '/^options:/,/^commands:/p' "$tmp/ctl.help" | grep -o -- '--[a-z-]*' >"$tmp/ctl.opts"
echo --help >>"$tmp/ctl.opts"
echo --version >>"$tmp/ctl.opts"
sed -n '/^commands:/,$p' "$tmp/ctl.help" | grep -o -- '--[a-z-]*' | sort -u >"$tmp/ctl.switches"
[ -s "$tmp/graphd.opts" ] && [ -s "$tmp/ctl.cmds" ] && [ -s "$tmp/ctl.switches" ] ||
  { echo "FAIL: cannot read --help"; exit 1; }

# --- bash ----------------------------------------------------------------
# bcomp WORDS...: what bash completes for the last word.
bcomp() {
  bash -c '. "$1/graphd.bash"; . "$1/graphctl.bash"; shift
    COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1))
    complete -p "$1" >/dev/null || exit 1
    f=$(complete -p "$1" | sed "s/.*-F \([^ ]*\).*/\1/"); "$f"
    printf "%s\n" "${COMPREPLY[@]}"' bcomp "$dir" "$@" | sed '/^$/d'
}
bcomp graphd -- >"$tmp/b" && same "bash: graphd's options" "$tmp/graphd.opts" "$tmp/b"
printf 'auto\ncuda\nhost\n' >"$tmp/w"
bcomp graphd --backend '' >"$tmp/b" && same "bash: graphd --backend" "$tmp/w" "$tmp/b"
printf 'error\nwarn\ninfo\ndebug\n' >"$tmp/w"
bcomp graphd --log-level '' >"$tmp/b" && same "bash: graphd --log-level" "$tmp/w" "$tmp/b"
printf 'yes\nno\n' >"$tmp/w"
bcomp graphd --fair-shares '' >"$tmp/b" && same "bash: graphd --fair-shares" "$tmp/w" "$tmp/b"
bcomp graphd --device-budget '' >"$tmp/b" && [ ! -s "$tmp/b" ] ||
  bad "bash: graphd --device-budget offers options for its value: $(cat "$tmp/b")"
bcomp graphctl '' >"$tmp/b" && same "bash: graphctl's commands" "$tmp/ctl.cmds" "$tmp/b"
bcomp graphctl --socket /tmp/s '' >"$tmp/b" &&
  same "bash: graphctl's commands after --socket" "$tmp/ctl.cmds" "$tmp/b"
bcomp graphctl - >"$tmp/b" && same "bash: graphctl's options" "$tmp/ctl.opts" "$tmp/b"
: >"$tmp/all"
for cmd in status list evict stats top; do
  bcomp graphctl "$cmd" -- >"$tmp/b"
  grep -qx -- --help "$tmp/b" || bad "bash: graphctl $cmd offers no --help"
  grep -vx -- --help "$tmp/b" >>"$tmp/all"
  # graphctl takes each (checked before it connects: a refused one exits 2).
  for sw in $(grep -vx -- --help "$tmp/b"); do
    case $sw in
      --capture) set -- "$sw" abcdef@0 ;;
      --program) set -- "$sw" abcdef ;;
      --device | --client | --session | --idle | --count) set -- "$sw" 1 ;;
      --interval) set -- "$sw" 0.5 ;;
      *) set -- "$sw" ;;
    esac
    [ "$cmd" = evict ] && [ "$sw" = --json ] && set -- --json --all
    [ "$cmd" = evict ] && [ "$sw" = --dry-run ] && set -- --dry-run --all
    "$graphctl" --socket "$tmp/nobody.sock" "$cmd" "$@" >/dev/null 2>&1
    [ $? -eq 3 ] || bad "graphctl $cmd $* is refused, though the completion offers $sw"
  done
done
same "bash: graphctl's switches, all commands" "$tmp/ctl.switches" "$tmp/all"

# --- zsh -----------------------------------------------------------------
if ! command -v zsh >/dev/null 2>&1; then
  echo "SKIP zsh half: zsh is not installed (Debian: zsh)"
  [ $fail = 0 ] && echo "completions OK (bash only)"
  exit $fail
fi
for f in "$dir/_graphd" "$dir/_graphctl"; do
  zsh -n "$f" || bad "zsh -n $f"
  head -1 "$f" | grep -q '^#compdef ' || bad "$f does not start with #compdef"
done
# zcomp WORDS...: what zsh completes for the line (ending in a space: a
# new word).
zcomp() {
  (cd "$tmp" && timeout 20 zsh "$here/zsh_complete.zsh" "$dir" "$@") | tr -d '\r' | sed '/^$/d'
}
zcomp "graphd --" >"$tmp/z" && same "zsh: graphd's options" "$tmp/graphd.opts" "$tmp/z"
printf 'error\nwarn\ninfo\ndebug\n' >"$tmp/w"
zcomp "graphd --log-level " >"$tmp/z" && same "zsh: graphd --log-level" "$tmp/w" "$tmp/z"
zcomp "graphctl " >"$tmp/z" && same "zsh: graphctl's commands" "$tmp/ctl.cmds" "$tmp/z"
: >"$tmp/all"
for cmd in status list evict stats top; do
  zcomp "graphctl $cmd --" | grep -vx -- --help >>"$tmp/all"
done
same "zsh: graphctl's switches, all commands" "$tmp/ctl.switches" "$tmp/all"

[ $fail = 0 ] && echo "completions OK (bash and zsh)"
exit $fail
