#!/bin/sh
# Loads a job's network policy into the node's network namespace, or removes it, as the node's root; the
# rulesets are built by the console (jobs.launch.network_policy) and arrive as arguments.
#
#   network-policy.sh apply TABLE RULESET   load RULESET, with the address this SSH session comes from
#                                           added to TABLE's console set: the console's address as the node
#                                           sees it, whatever lies between them
#   network-policy.sh load RULESET          load RULESET as it is (the removal of tables)
#
# Each load is one nftables transaction: all of it applies, or none of it.
set -eu
mode=$1
shift

case "$mode" in
apply)
    table=$1 ruleset=$2
    case "$table" in
    "" | *[!A-Za-z0-9_]*) echo "bad table name" >&2; exit 64 ;;
    esac
    console=${SSH_CONNECTION:-}
    console=${console%% *}
    case "$console" in
    "" | *[!0-9A-Fa-f.:]*) echo "the console's address is unknown (no SSH_CONNECTION)" >&2; exit 65 ;;
    *:*) console_set=console_v6 ;;
    *) console_set=console_v4 ;;
    esac
    printf '%s\nadd element inet %s %s { %s }\n' "$ruleset" "$table" "$console_set" "$console" | nft -f -
    ;;
load)
    printf '%s\n' "$1" | nft -f -
    ;;
*)
    exit 64
    ;;
esac
