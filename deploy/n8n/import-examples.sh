#!/bin/sh
# Import the Loop Stop credential and the webhook self-call example into this
# n8n, and publish it. Run inside the n8n container:
#   docker compose -f deploy/docker-compose.yml exec n8n loopstop-import-examples
#   docker compose -f deploy/docker-compose.yml restart n8n   # publishing takes effect at start
# The credential's token is LOOPSTOP_TOKEN_N8N, the same variable loopstop reads.
set -eu
: "${LOOPSTOP_TOKEN_N8N:?LOOPSTOP_TOKEN_N8N is not set in the n8n container}"
url="${LOOPSTOP_URL:-http://loopstop:8765}"
creds="$(mktemp)"
cat > "$creds" <<JSON
[{"id": "lsExLoopStopCred", "name": "Loop Stop", "type": "loopStopApi",
  "data": {"baseUrl": "$url", "token": "$LOOPSTOP_TOKEN_N8N"}},
 {"id": "lsExModelGate001", "name": "Loop Stop model gate", "type": "openAiApi",
  "data": {"apiKey": "$LOOPSTOP_TOKEN_N8N", "url": "$url/v1/openai"}}]
JSON
n8n import:credentials --input="$creds"
rm -f "$creds"
n8n import:workflow --input=/opt/loopstop/examples/webhook-self-call.json
n8n publish:workflow --id=lsExSelfCall0001
echo "imported; now restart n8n (docker compose restart n8n), then:"
echo "  curl -s -X POST http://127.0.0.1:5678/webhook/loopstop-self-call -H 'Content-Type: application/json' -d '{\"run\": \"r1\", \"hop\": 0}'"
