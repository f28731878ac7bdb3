-- One activation of a fresh event per request (each a new chain).
local counter = 0
local thread_id = 0
local token = os.getenv("BENCH_TOKEN") or ""
local run = os.getenv("BENCH_RUN") or "r"

function setup(thread)
  thread:set("id", tostring(math.random(1, 1e9)))
end

function init(args)
  thread_id = id
end

function request()
  counter = counter + 1
  local key = "evt-" .. run .. "-" .. thread_id .. "-" .. counter
  return wrk.format("POST", "/v1/activations",
    {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token},
    '{"workflow": "bench", "event_key": "' .. key .. '", "subject_key": "' .. key ..
    '", "content": {"id": ' .. counter .. ', "status": "new"}}')
end
