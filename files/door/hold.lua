# Managed by the dual-spark deploy (tasks/door.py): edits here are overwritten.
-- (Lua skips a first line that starts with "#".) Holds a request at the front door while vLLM is
-- drained for a planned stop, so that it is not sent to a vLLM about to go (the deploy drains it
-- through the runtime API, files/dual_spark/door.py, waits for the requests in flight, stops
-- vLLM, then makes it ready again), and while the door's health check sees vLLM down (a heal: an
-- engine that died answers 503 until its process ends). A request held longer than
-- DUAL_SPARK_HOLD seconds is answered 503. Each hold is counted (counts.lua, loaded first).

local bound = tonumber(os.getenv("DUAL_SPARK_HOLD")) or 1800

local function held(server, health)
  local status = server:get_stats()["status"] or ""
  return status:find("DRAIN", 1, true) ~= nil or status:find("MAINT", 1, true) ~= nil
    or (health:get_stats()["status"] or ""):find("DOWN", 1, true) ~= nil
end

core.register_action("dual_spark_hold", {"http-req"}, function(txn)
  local server, health = core.backends["vllm"].servers["vllm"], core.backends["vllm_health"].servers["vllm"]
  if not held(server, health) then return end
  local hold, start = door_counts.hold_begins(), core.now()
  while held(server, health) do
    if core.now().sec - start.sec >= bound then
      txn:set_var("txn.held_out", true)
      door_counts.hold_ends(hold, true)
      return
    end
    core.msleep(200)
  end
  door_counts.hold_ends(hold, false)
end)
