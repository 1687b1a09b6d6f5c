# Managed by the dual-spark deploy (tasks/door.py): edits here are overwritten.
-- (Lua skips a first line that starts with "#".) Holds a request at the front door while vLLM is
-- drained for a change, so that it is not sent to a vLLM about to go, nor to the state that follows
-- before that state has passed its canaries (the deploy drains vLLM through the runtime API,
-- files/dual_spark/door.py, waits for the requests in flight, stops vLLM, and makes it ready again
-- once the change has served and passed, or the state before is back), and while the door's health
-- check sees vLLM down (a heal: an engine that died answers 503 until its process ends). A request
-- held longer than DUAL_SPARK_HOLD seconds is answered 503. Each hold is counted (counts.lua,
-- loaded first). A drain no run ended (one killed on the way) ends by itself after
-- DUAL_SPARK_GATE_LAPSE seconds, when the change's planned work lapses too.

local bound = tonumber(os.getenv("DUAL_SPARK_HOLD")) or 1800
local lapse = tonumber(os.getenv("DUAL_SPARK_GATE_LAPSE")) or 3600

local function drained(server)
  local status = server:get_stats()["status"] or ""
  return status:find("DRAIN", 1, true) ~= nil or status:find("MAINT", 1, true) ~= nil
end

local function held(server, health)
  return drained(server) or (health:get_stats()["status"] or ""):find("DOWN", 1, true) ~= nil
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

core.register_task(function()
  local since
  while true do
    local server = core.backends["vllm"].servers["vllm"]
    if (server:get_stats()["status"] or ""):find("DRAIN", 1, true) then
      since = since or core.now().sec
      if core.now().sec - since >= lapse then
        server:set_ready()
        core.Warning("dual-spark door: vLLM drained " .. lapse .. " s and no run made it ready: ready again")
        since = nil
      end
    else
      since = nil
    end
    core.sleep(1)
  end
end)
