-- A model turn through the model gate (chat completions, not streamed): the
-- System Message names one of several tasks (BENCH_TASKS, split over the
-- threads), round-robin, as several agents would; the upstream (the stand-in
-- model, --mode final) answers a short text with its usage.
local counter = 0
local token = os.getenv("BENCH_TOKEN") or ""
local all = {}
for t in string.gmatch(os.getenv("BENCH_TASKS") or "", "[^,]+") do table.insert(all, t) end
local threads = tonumber(os.getenv("BENCH_THREADS") or "2")
local next_thread = 0

function setup(thread)
  local mine = {}
  for i = next_thread + 1, #all, threads do table.insert(mine, all[i]) end
  thread:set("mine", table.concat(mine, ","))
  next_thread = next_thread + 1
end

local tasks = nil

function request()
  if tasks == nil then
    tasks = {}
    for t in string.gmatch(mine, "[^,]+") do table.insert(tasks, t) end
  end
  counter = counter + 1
  local task = tasks[(counter % #tasks) + 1]
  local headers = {["Content-Type"] = "application/json", ["Authorization"] = "Bearer " .. token}
  return wrk.format("POST", "/v1/openai/chat/completions", headers,
    '{"model": "m", "messages": [' ..
    '{"role": "system", "content": "You are an agent.\\nloopstop-task: ' .. task .. '"}, ' ..
    '{"role": "user", "content": "Where is order ORD-' .. counter .. '?"}]}')
end
