-- Begin a fresh operation id on every request (a first begin: nothing stored yet).
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
  local op = "bench-" .. run .. "-b-" .. thread_id .. "-" .. counter
  return wrk.format("POST", "/v1/operations/" .. op .. "/begin",
    {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token},
    '{"payload": {"n": ' .. counter .. '}, "workflow": "bench"}')
end
