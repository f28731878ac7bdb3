#!/bin/sh
# Put the Loop Stop node into n8n's community-packages folder (a volume), then
# start n8n as its own image does.
set -eu
nodes="${N8N_USER_FOLDER:-$HOME}/.n8n/nodes"
mkdir -p "$nodes"
cp -R /opt/loopstop/nodes/. "$nodes/"
exec /docker-entrypoint.sh "$@"
