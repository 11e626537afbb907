#!/bin/sh
# Every LOOM_* variable the product code names as a whole string literal
# (getenv("LOOM_X"), setenv, env_set(e, "LOOM_X", ...), os.environ.get('LOOM_X'))
# must have a row in the settings table, which loom-info prints: a variable
# read around the table is one its users cannot find, and whose help can drift.
# Names in literals that are not variables are excused below, by name.
set -u
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
info="$top_builddir/tools/loom-info"
[ -x "$info" ] || { echo "missing $info"; exit 1; }

# Not environment variables: the redis store's reply word for an oversized
# value, and the public initializer macro named in an error message.
not_variables='LOOM_VALUE_TOO_BIG LOOM_CONFIG_INIT'

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$info" | sed -n '/^# Settings/,$p' | grep -oE '^LOOM_[A-Z0-9_]+' | sort -u > "$tmp/table"
# A table that lost its printout would excuse everything.
[ "$(wc -l < "$tmp/table")" -ge 40 ] || { echo "FAIL: loom-info lists only $(wc -l < "$tmp/table") settings"; exit 1; }

files=$(cd "$top_srcdir" && find base store src transports algorithms cuda tools python/loom -type f \
            \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cpp' -o -name '*.py' \
               -o -name 'loom-timeline-merge' \) | sort)
[ -n "$files" ] || { echo "FAIL: no sources under $top_srcdir"; exit 1; }
(cd "$top_srcdir" && grep -HnoE "[\"']LOOM_[A-Z0-9_]+[\"']" $files) |
    sed -E "s/[\"']//g" > "$tmp/uses"
[ -s "$tmp/uses" ] || { echo "FAIL: found no LOOM_ names in the sources"; exit 1; }

failed=0
for name in $(cut -d: -f3 "$tmp/uses" | sort -u); do
    case " $not_variables " in *" $name "*) continue ;; esac
    if ! grep -qx "$name" "$tmp/table"; then
        echo "FAIL: $name is not in the settings table (base/settings.c), used at:"
        grep ":$name\$" "$tmp/uses" | cut -d: -f1,2 | sed 's/^/    /'
        failed=1
    fi
done
[ $failed = 0 ] && echo "PASS: $(cut -d: -f3 "$tmp/uses" | sort -u | wc -l) names used in the sources, all in the table of $(wc -l < "$tmp/table")"
exit $failed
