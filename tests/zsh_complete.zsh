# Prints, one a line, the matches zsh's completion offers for a command
# line, by driving an interactive zsh in a pseudo-terminal (zpty) and
# printing what the completion functions give compadd.
# Usage: zsh zsh_complete.zsh COMPLETION_DIR WORDS...   (for tests/test_completion.sh)
zmodload zsh/zpty
dir=$1
shift
zpty z zsh -f -i
zpty -w z "fpath=($dir \$fpath); autoload -Uz compinit; compinit -u -D"
zpty -w z 'bindkey "^I" complete-word'
zpty -w z 'null-line () { echo -E - $'"'"'\0'"'"' }'
zpty -w z 'compprefuncs=( null-line )'
zpty -w z 'comppostfuncs=( null-line exit )'
zpty -w z 'zstyle ":completion:*" list-grouped false; zstyle ":completion:*" insert-tab false'
zpty -w z 'compadd () {
  [[ ${@[1, -1]} == *-(O|A|D)\ * ]] && { builtin compadd "$@"; return $? }
  typeset -a __hits __dscr
  (( $@[(I)-d] )) && { __dscr=( "${(@P)${@[$[${@[(i)-d]}+1]]}}" ) }
  builtin compadd -A __hits -D __dscr "$@"
  setopt localoptions norcexpandparam extendedglob
  typeset -A apre hpre hsuf asuf
  zparseopts -E P:=apre p:=hpre S:=asuf s:=hsuf
  for i in {1..$#__hits}; do print -r -- $__hits[i]; done
}'
zpty -w -n z "$*"$'\t'
zpty -r z chunk '*'$'\0''*'$'\0'
print -r -- ${${chunk#*$'\0'}%$'\0'*}
zpty -d z
