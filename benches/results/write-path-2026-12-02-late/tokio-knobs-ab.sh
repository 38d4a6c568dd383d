#!/bin/bash
# usage: ab.sh LABEL ENV... : one twinhub-only compare with the env set
label=$1; shift
env "$@" /tmp/exp/target/release/twinhub bench compare --systems twinhub --duration 30 --concurrency 64 --twins 10000 --value-bytes 200 --out /tmp/expres/$label.json > /tmp/expres/$label.txt 2>/tmp/expres/$label.err
grep -E "twinhub" /tmp/expres/$label.txt | head -2
