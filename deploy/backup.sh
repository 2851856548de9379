#!/bin/sh
# Backups of the Cosched database (docs/maintenance.md): pg_dump in PostgreSQL's custom format
# every BACKUP_INTERVAL_S seconds into BACKUP_DIR, keeping BACKUP_KEEP_DAYS days. Connection
# from the usual PG* variables (PGHOST, PGUSER, PGPASSWORD, PGDATABASE). "once" makes one
# dump and exits (what the restore test and an operator before an upgrade use).
set -eu
dir=${BACKUP_DIR:-/backups}
keep=${BACKUP_KEEP_DAYS:-14}
every=${BACKUP_INTERVAL_S:-86400}
mkdir -p "$dir"
while :; do
    ok=1
    name="$dir/cosched-$(date -u +%Y%m%dT%H%M%SZ).dump"
    if pg_dump -Fc -f "$name.partial"; then
        mv "$name.partial" "$name"   # a dump is there whole or not at all
        echo "backup: $name ($(wc -c < "$name") bytes)"
    else
        rm -f "$name.partial"
        echo "backup: pg_dump failed" >&2
        ok=0
    fi
    find "$dir" -name 'cosched-*.dump' -mtime +"$keep" -print -delete
    if [ "${1:-}" = once ]; then [ "$ok" = 1 ]; exit; fi
    sleep "$every"
done
