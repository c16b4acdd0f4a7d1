-- The book's pandoc filter: each src block gets its label (the file it is
-- tangled to), noweb references in the web page link to the block they
-- name, and the Org property drawers that pandoc keeps on headings go.
-- Tangled from mlplcode.org, chapter "Export".

local named = {}

local function collect_name(block)
  if block.identifier ~= "" then
    named[block.identifier] = true
  end
end

local function escape_html(text)
  return (text:gsub("&", "&amp;"):gsub("<", "&lt;"):gsub(">", "&gt;"):gsub('"', "&quot;"))
end

local function indentations(text)
  local widths = {}
  for line in (text .. "\n"):gmatch("(.-)\n") do
    table.insert(widths, #line:match("^ *"))
  end
  return widths
end

local rendered = 0

local function html_code(block)
  rendered = rendered + 1
  local id = "src-" .. rendered
  local names = {}
  local text = block.text:gsub("<<([^<>\n]+)>>", function(name)
    if named[name] then
      table.insert(names, name)
      return "MLPLCODENOWEB" .. #names .. "X"
    end
  end)
  local code = pandoc.CodeBlock(text, { id = id, class = block.classes[1] })
  local html = pandoc.write(pandoc.Pandoc({ code }), "html5")
  local widths = indentations(block.text)
  html = html:gsub('<span id="[^"]*%-(%d+)">', function(k)
    return '<span id="' .. id .. "-" .. k .. '" style="--indent: ' .. widths[tonumber(k)] .. '">'
  end)
  html = html:gsub("MLPLCODENOWEB(%d+)X", function(n)
    local name = escape_html(names[tonumber(n)])
    return '<a class="noweb" href="#' .. name .. '">&lt;&lt;' .. name .. "&gt;&gt;</a>"
  end)
  return pandoc.RawBlock("html", html)
end

local function typst_string(text)
  return '"' .. text:gsub("\\", "\\\\"):gsub('"', '\\"') .. '"'
end

local function labelled(block)
  if #block.classes == 0 then
    return nil
  end
  local label = block.attributes.label
  if FORMAT:match("html") then
    local parts = { html_code(block) }
    if label then
      table.insert(parts, 1, pandoc.Div(pandoc.Plain({ pandoc.Code(label) }), { class = "src-label" }))
    end
    return pandoc.Div(parts, { id = block.identifier, class = "src" })
  end
  local code = pandoc.CodeBlock(block.text, { class = block.classes[1] })
  if not label then
    return code
  end
  if FORMAT == "typst" then
    return { pandoc.RawBlock("typst", "#src-label(" .. typst_string(label) .. ")"), code }
  end
  return { pandoc.Plain({ pandoc.Code(label) }), code }
end

local function without_properties(header)
  header.attributes = {}
  return header
end

return {
  { CodeBlock = collect_name },
  { CodeBlock = labelled, Header = without_properties },
}
