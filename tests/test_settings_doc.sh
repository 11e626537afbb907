#!/bin/sh
# test_settings_doc.sh - docs/settings.md is what `loom-info --markdown`
# prints, so the settings' documentation cannot drift from the table that
# parses them (base/settings.c).
top_builddir=${top_builddir:-.}
top_srcdir=${top_srcdir:-.}
info="$top_builddir/tools/loom-info"
if ! "$info" --markdown | diff -u "$top_srcdir/docs/settings.md" -; then
    echo "FAIL: docs/settings.md differs from loom-info --markdown (above);"
    echo "      regenerate it: tools/loom-info --markdown > docs/settings.md"
    exit 1
fi
echo "PASS: docs/settings.md matches loom-info --markdown"
