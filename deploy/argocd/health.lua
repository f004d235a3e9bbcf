-- Argo CD health of tessera's GPUPartition and GPUQuota (resource.customizations.health).
--
-- 1. status.observedGeneration missing or behind metadata.generation -> Progressing
--    (the operator has not looked at this spec yet);
-- 2. condition Degraded=True -> Degraded, with its message;
-- 3. condition Ready=True -> Healthy, with its message;
-- 4. anything else -> Progressing, with the Ready condition's message.
--
-- Written for Argo CD's default Lua sandbox (no string library): only base functions.
local hs = {}

local function condition(kind)
  if obj.status == nil or obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local function says(c)
  if c.message ~= nil and c.message ~= "" then
    return c.message
  end
  if c.reason ~= nil then
    return c.reason
  end
  return c.type .. " is " .. tostring(c.status)
end

local generation = obj.metadata.generation
local observed = nil
if obj.status ~= nil then
  observed = obj.status.observedGeneration
end
if observed == nil or (generation ~= nil and observed < generation) then
  hs.status = "Progressing"
  hs.message = "waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local degraded = condition("Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = says(degraded)
  return hs
end

local ready = condition("Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  hs.message = says(ready)
  return hs
end

hs.status = "Progressing"
if ready ~= nil then
  hs.message = says(ready)
else
  hs.message = "waiting for the Ready condition"
end
return hs
