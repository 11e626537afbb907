#!/bin/sh
# include_edges.sh [-v] [srcdir] - the include graph between the top folders
# of the tree: one line "from -> to  count" per pair of folders an #include
# "dir/..." joins; with -v, then every edge as "  from -> to  file:line".
# tests/test_layers.sh checks these edges against the layer rule
# (CONTRIBUTING.md); this shows them to a reader.
verbose=0
[ "$1" = -v ] && { verbose=1; shift; }
top=${1:-$(dirname "$0")/..}
cd "$top" || exit 1

layers="include base store transports algorithms src cuda tools tests bench examples python"

edges=$(find $layers -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cc' \
                                -o -name '*.cpp' \) 2>/dev/null | grep -v '^python/\(build\|lib\)' | sort |
    xargs grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[a-z_]+/' /dev/null |
    sed -E 's|^([^:]*):([0-9]+):[[:space:]]*#[[:space:]]*include[[:space:]]*"([a-z_]+)/.*|\1:\2 \3|' |
    while read -r at to; do
        from=${at%%/*}
        # A folder of the file's own folder (transports/tcp/...) is not a layer.
        case " $layers " in *" $to "*) ;; *) continue ;; esac
        [ "$from" = "$to" ] || echo "$from $to $at"
    done)

printf '%s\n' "$edges" | awk 'NF {n[$1 " -> " $2]++} END {for (e in n) printf "%-26s %d\n", e, n[e]}' | sort
[ $verbose = 1 ] && printf '%s\n' "$edges" | awk 'NF {print "  " $1 " -> " $2 "  " $3}'
exit 0
