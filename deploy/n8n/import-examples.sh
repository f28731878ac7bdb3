#!/bin/sh
# Import the Loop Stop and OpenAI (model gate) credentials, the webhook
# self-call example and the gate-only agent (its tool pointed at the stand-in
# notes service of docker-compose.yml) into this n8n, and publish both.
# Run inside the n8n container:
#   docker compose -f deploy/docker-compose.yml exec n8n loopstop-import-examples
#   docker compose -f deploy/docker-compose.yml restart n8n   # publishing takes effect at start
# The credential's token is LOOPSTOP_TOKEN_N8N, the same variable loopstop reads.
# LOOPSTOP_URL (http://loopstop:8765) and RECORDS_URL (http://records:8790) name
# the services as n8n reaches them; the self-call example calls n8n on N8N_PORT.
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
examples="${LOOPSTOP_EXAMPLES:-/opt/loopstop/examples}"
flows="$(mktemp -d)"
sed "s#http://localhost:5678#http://localhost:${N8N_PORT:-5678}#g" \
  "$examples/webhook-self-call.json" > "$flows/webhook-self-call.json"
sed "s#http://127.0.0.1:8790#${RECORDS_URL:-http://records:8790}#g" \
  "$examples/gate-only-agent.json" > "$flows/gate-only-agent.json"
n8n import:workflow --separate --input="$flows"
rm -rf "$flows"
n8n publish:workflow --id=lsExSelfCall0001
n8n publish:workflow --id=lsExGateAgent001
echo "imported; now restart n8n (docker compose restart n8n), then:"
echo "  curl -s -X POST http://127.0.0.1:5678/webhook/loopstop-self-call -H 'Content-Type: application/json' -d '{\"run\": \"r1\", \"hop\": 0}'"
echo "  curl -s -X POST http://127.0.0.1:5678/webhook/loopstop-gate-agent -H 'Content-Type: application/json' -d '{\"ticket\": \"T-1\", \"question\": \"Add a note.\"}'"
