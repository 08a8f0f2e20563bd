# bash completion for graphctl(1), installed as
# /usr/share/bash-completion/completions/graphctl. Needs no helper from the
# bash-completion package. Kept in step with `graphctl --help` by
# tests/test_completion.sh.

_graphctl_commands="status list evict stats top ping version help"
_graphctl_options="--socket --timeout --help --version"

# The switches each command takes (evict's selectors first).
_graphctl_switches() {
  case $1 in
    status | list) echo "--json" ;;
    evict) echo "--capture --program --device --client --session --idle --all --dry-run --json" ;;
    stats) echo "--json --prometheus --requests" ;;
    top) echo "--interval --count" ;;
  esac
}

_graphctl() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]}
  local i cmd= ctl=(graphctl)
  COMPREPLY=()
  # graphctl's own options, then the command.
  for ((i = 1; i < COMP_CWORD; i++)); do
    case ${COMP_WORDS[i]} in
      -s | --socket | -t | --timeout)
        ctl+=("${COMP_WORDS[i]}" "${COMP_WORDS[i + 1]}")
        ((i++))
        ;;
      -*) ;;
      *)
        cmd=${COMP_WORDS[i]}
        break
        ;;
    esac
  done
  case $prev in
    -s | --socket)
      mapfile -t COMPREPLY < <(compgen -f -- "$cur")
      return
      ;;
    --capture)
      # The captures the daemon holds now, as list shows them.
      mapfile -t COMPREPLY < <(compgen -W "$("${ctl[@]}" --timeout 2000 list 2>/dev/null |
        awk 'NR > 1 && $1 ~ /@/ { print $1 }')" -- "$cur")
      return
      ;;
    -t | --timeout | --program | --device | --client | --session | --idle | --interval | --count)
      return
      ;;
  esac
  if [[ -z $cmd ]]; then
    if [[ $cur == -* ]]; then
      mapfile -t COMPREPLY < <(compgen -W "$_graphctl_options" -- "$cur")
    else
      mapfile -t COMPREPLY < <(compgen -W "$_graphctl_commands" -- "$cur")
    fi
    return
  fi
  [[ $cur == -* || -z $cur ]] &&
    mapfile -t COMPREPLY < <(compgen -W "$(_graphctl_switches "$cmd") --help" -- "$cur")
}
complete -F _graphctl graphctl
