# bash completion for graphd(8), installed as
# /usr/share/bash-completion/completions/graphd. Needs no helper from the
# bash-completion package. Kept in step with `graphd --help` by
# tests/test_completion.sh.

_graphd_options="--socket --socket-mode --socket-group --backend --host-devices --host-memory
  --host-busy-ms --devices --max-frame --admin-group --device-budget --ready-timeout --shutdown-grace
  --hello-timeout --idle-timeout --max-connections --max-connections-per-uid
  --max-region-bytes-per-uid --max-region-bytes-per-session --max-regions-per-session
  --max-regions-per-uid --max-programs --max-programs-per-uid --max-module-bytes
  --max-module-bytes-per-uid --max-program-bytes --max-program-bytes-per-uid
  --max-inflight-replays --max-host-maps --fair-shares --gpu-time-sample --ready-hold-rings
  --ready-hold-max-us --host-module-allow --metrics-listen --metrics-header-timeout
  --metrics-connections-per-address --log-level --config --check-config --version --help"

_graphd() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD - 1]}
  COMPREPLY=()
  case $prev in
    --socket | --config | --host-module-allow)
      mapfile -t COMPREPLY < <(compgen -f -- "$cur")
      return
      ;;
    --socket-group | --admin-group)
      mapfile -t COMPREPLY < <(compgen -g -- "$cur")
      return
      ;;
    --backend)
      mapfile -t COMPREPLY < <(compgen -W "auto cuda host" -- "$cur")
      return
      ;;
    --log-level)
      mapfile -t COMPREPLY < <(compgen -W "error warn info debug" -- "$cur")
      return
      ;;
    --fair-shares)
      mapfile -t COMPREPLY < <(compgen -W "yes no" -- "$cur")
      return
      ;;
    --check-config | --version | --help) ;;
    --*)
      # Every other option takes a value: a number, size or address.
      [[ " ${_graphd_options//$'\n'/ } " == *" $prev "* ]] && return
      ;;
  esac
  mapfile -t COMPREPLY < <(compgen -W "$_graphd_options" -- "$cur")
}
complete -F _graphd graphd
