-- Shared by tool_call.lua and model_turn.lua (bench/run.py puts it first):
-- BENCH_TASKS, comma-separated task ids, split evenly over the wrk threads
-- (BENCH_THREADS); my_tasks() is this thread's share.
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

local function my_tasks()
  if tasks == nil then
    tasks = {}
    for t in string.gmatch(mine, "[^,]+") do table.insert(tasks, t) end
  end
  return tasks
end
