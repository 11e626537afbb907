#!/bin/sh
# test_layers.sh - the layer rule (CONTRIBUTING.md): a folder includes only
# from the folders below it,
#
#     include <- base <- {store, transports} <- algorithms <- src <- {cuda, tools}
#
# store and transports never include each other, examples/bench/python only
# the public headers; tests may include anything. Every #include "dir/..."
# edge is checked; a violation is named by file and line.
top=${top_srcdir:-$(dirname "$0")/..}

below() {
    case $1 in
    include) echo "" ;;
    base) echo "include" ;;
    store | transports) echo "include base" ;;
    algorithms) echo "include base transports" ;;
    src) echo "include base store transports algorithms" ;;
    cuda | tools) echo "include base store transports algorithms src" ;;
    examples | bench | python) echo "include" ;;
    tests) echo "*" ;;
    *) echo "" ;;
    esac
}

edges=$(sh "$top/tests/include_edges.sh" -v "$top" | sed -n 's/^  //p')
[ -n "$edges" ] || { echo "FAIL: tests/include_edges.sh found no include edges in $top"; exit 1; }

failed=0
while read -r from arrow to at; do
    ok=$(below "$from")
    case " $ok " in *" $to "* | *" * "*) continue ;; esac
    echo "FAIL: $at: $from/ includes $to/, which is not below it (CONTRIBUTING.md, \"Layers\")"
    failed=1
done <<EOF2
$edges
EOF2
[ $failed = 0 ] && echo "PASS: every include between folders goes down a layer"
exit $failed
