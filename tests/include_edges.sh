#!/bin/sh
# include_edges.sh [srcdir] - the folder-level include graph of the tree: one
# line "from -> to  count" per pair of top-level folders that an #include
# "dir/..." joins, then every file:line behind an edge when -v is given.
# tests/test_layers.sh checks these edges against the layer rule
# (CONTRIBUTING.md); this prints them for a reader.
verbose=0
[ "$1" = -v ] && { verbose=1; shift; }
top=${1:-$(dirname "$0")/..}
cd "$top" || exit 1

layers="include base store transports algorithms src cuda tools tests bench examples python"

# Every quoted include naming a folder of the tree, as "file:line:folder".
edges() {
    find $layers -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cc' \
                            -o -name '*.cpp' \) 2>/dev/null | sort |
    while read -r f; do
        sed -n 's/^[ \t]*#[ \t]*include[ \t]*"\([a-z_]*\)\/.*/\1/p;=' "$f" |
            sed -n '/^[0-9]*$/{h;d};x;G;s/\n/:/;p' | sed "s|^|$f:|"
    done
}

edges | while IFS=: read -r file line to; do
    from=${file%%/*}
    case " $layers " in *" $to "*) ;; *) continue ;; esac
    [ "$from" = "$to" ] && continue
    echo "$from $to $file:$line"
done > "${TMPDIR:-/tmp}/loom_edges.$$"

awk '{n[$1" -> "$2]++} END {for (e in n) printf "%-28s %d\n", e, n[e]}' \
    "${TMPDIR:-/tmp}/loom_edges.$$" | sort
[ $verbose = 1 ] && awk '{print "  " $1 " -> " $2 "  " $3}' "${TMPDIR:-/tmp}/loom_edges.$$"
rm -f "${TMPDIR:-/tmp}/loom_edges.$$"
