-- The book's pandoc filter: each src block gets its label (the file it is
-- tangled to, or the name a reference gives it), noweb references link to
-- the blocks they name, each of those says where it is used, links to
-- headings lead to them, an index of names and files closes the book, and
-- the Org property drawers that pandoc keeps on headings go. Tangled from
-- mlplcode.org, chapter "Export".

local html, typst = FORMAT:match("html") ~= nil, FORMAT == "typst"
local links = { blocks = {}, fragments = {}, files = {} }

local fragment_named = {}

local function take_cross_references(raw)
  if raw.format == "mlplcode" then
    links = pandoc.json.decode(raw.text, false)
    for _, fragment in ipairs(links.fragments) do
      fragment_named[fragment.name] = fragment
    end
    return {}
  end
end

local function into_parts(doc)
  local in_parts = false
  for _, block in ipairs(doc.blocks) do
    if block.t == "Header" then
      if block.attributes.part then
        in_parts = true
        block.classes:extend({ "unnumbered", "part" })
      elseif in_parts then
        block.level = block.level - 1
      end
    end
  end
  return doc
end

local sections = {}

local function note_sections(doc)
  local counters, current = {}, {}
  doc:walk({
    traverse = "topdown",
    Header = function(header)
      local number = nil
      if not header.classes:includes("unnumbered") then
        counters[header.level] = (counters[header.level] or 0) + 1
        for level = header.level + 1, 6 do
          counters[level] = nil
        end
        local parts = {}
        for level = 1, header.level do
          parts[level] = tostring(counters[level] or 0)
        end
        number = table.concat(parts, ".")
      end
      current = { number = number, id = header.identifier,
                  title = pandoc.utils.stringify(header.content) }
    end,
    CodeBlock = function(block)
      if block.attributes.anchor then
        sections[block.attributes.anchor] = current
      end
    end,
  })
end

local function name_text(name)
  if html or typst then
    return "⟨" .. name .. "⟩"
  end
  return "<<" .. name .. ">>"
end

local function label_of(anchor)
  local block = links.blocks[anchor]
  if block.file then
    return block.file
  end
  return block.name and name_text(block.name)
end

local function typst_string(text)
  return '"' .. text:gsub("\\", "\\\\"):gsub('"', '\\"') .. '"'
end

local function place(anchor, with_label)
  local label = with_label and label_of(anchor) or nil
  local section = sections[anchor]
  if not section then
    return { pandoc.Code(label or anchor) }
  end
  if typst then
    local call = label
      and "block-ref(" .. typst_string(anchor) .. ", " .. typst_string(label)
      or "page-ref(" .. typst_string(anchor)
    return { pandoc.RawInline("typst", "#" .. call .. ");") }
  end
  if html then
    local text = pandoc.Inlines(label and { pandoc.Code(label), pandoc.Space() } or {})
    text:insert(pandoc.Str(section.number and "§" .. section.number or section.title))
    return { pandoc.Link(text, "#" .. anchor) }
  end
  local quoted = pandoc.Quoted("DoubleQuote", pandoc.Inlines(section.title))
  local title = pandoc.Link({ quoted }, "#" .. section.id)
  if label then
    return { pandoc.Code(label), pandoc.Str(","), pandoc.Space(), pandoc.Str("in"),
             pandoc.Space(), title }
  end
  return { title }
end

local function series(places)
  local inlines = pandoc.Inlines({})
  for k, one in ipairs(places) do
    if k > 1 then
      inlines:extend(k == #places
        and { pandoc.Space(), pandoc.Str("and"), pandoc.Space() }
        or { pandoc.Str(","), pandoc.Space() })
    end
    inlines:extend(one)
  end
  return inlines
end

local function places(anchors, with_label)
  local list = {}
  for _, anchor in ipairs(anchors) do
    table.insert(list, place(anchor, with_label))
  end
  return list
end

local function note(anchor)
  local inlines = pandoc.Inlines({})
  local defines = links.blocks[anchor].defines
  for _, fragment in ipairs(defines) do
    if #inlines > 0 then
      inlines:insert(pandoc.Space())
    end
    if #defines > 1 then
      inlines:extend({ pandoc.Code(name_text(fragment.name)), pandoc.Str(":"),
                       pandoc.Space() })
    end
    if #fragment.parts > 1 then
      local others, part, named = {}, 0, {}
      for k, other in ipairs(fragment.parts) do
        local section = sections[other] and sections[other].id or other
        if other == anchor then
          part = k
        elseif not named[section] then
          named[section] = true
          table.insert(others, place(other, false))
        end
      end
      local of = "Part " .. part .. " of " .. #fragment.parts .. ", with "
      inlines:extend(pandoc.Inlines(of))
      inlines:extend(series(others))
      inlines:extend({ pandoc.Str("."), pandoc.Space() })
    end
    inlines:extend(pandoc.Inlines("Used in "))
    inlines:extend(series(places(fragment.used_in, true)))
    inlines:insert(pandoc.Str("."))
  end
  return inlines
end

local function escape_html(text)
  return (text:gsub("&", "&amp;"):gsub("<", "&lt;"):gsub(">", "&gt;")
    :gsub('"', "&quot;"))
end

local function indentations(text)
  local widths = {}
  for line in (text .. "\n"):gmatch("(.-)\n") do
    table.insert(widths, #line:match("^ *"))
  end
  return widths
end

local function literal(text)
  return (text:gsub("%p", "%%%0"))
end

local rendered = 0

local function html_code(block, targets)
  rendered = rendered + 1
  local id = "src-" .. rendered
  local names, text = {}, block.text
  for name in pairs(targets) do
    text = text:gsub(literal("<<" .. name .. ">>"), function()
      table.insert(names, name)
      return "MLPLCODENOWEB" .. #names .. "X"
    end)
  end
  local code = pandoc.CodeBlock(text, { id = id, class = block.classes[1] })
  local page = pandoc.write(pandoc.Pandoc({ code }), "html5")
  local widths = indentations(block.text)
  page = page:gsub('<span id="[^"]*%-(%d+)">', function(k)
    return '<span id="' .. id .. "-" .. k .. '" style="--indent: '
      .. widths[tonumber(k)] .. '">'
  end)
  page = page:gsub("MLPLCODENOWEB(%d+)X", function(n)
    local name = names[tonumber(n)]
    return '<a class="ref" href="#' .. escape_html(targets[name]) .. '">'
      .. escape_html(name_text(name)) .. "</a>"
  end)
  return pandoc.RawBlock("html", page)
end

local function typst_dictionary(targets)
  local names = {}
  for name in pairs(targets) do
    table.insert(names, name)
  end
  table.sort(names)
  local entries = {}
  for _, name in ipairs(names) do
    table.insert(entries, typst_string(name) .. ": " .. typst_string(targets[name]))
  end
  return "(" .. (#entries > 0 and table.concat(entries, ", ") or ":") .. ")"
end

local function typst_block(text)
  return pandoc.RawBlock("typst", text)
end

local function src_block(block)
  if #block.classes == 0 then
    return nil
  end
  local anchor = block.attributes.anchor
  local entry = links.blocks[anchor or ""] or { links = {}, defines = {} }
  local label = anchor and label_of(anchor)
  local remark = anchor and note(anchor) or {}
  if html then
    local parts = { html_code(block, entry.links) }
    if label then
      table.insert(parts, 1, pandoc.Div(pandoc.Plain({ pandoc.Code(label) }),
                                        { class = "src-label" }))
    end
    if #remark > 0 then
      table.insert(parts, pandoc.Div(pandoc.Plain(remark), { class = "src-note" }))
    end
    return pandoc.Div(parts, { id = anchor, class = "src" })
  end
  local out = { pandoc.CodeBlock(block.text, { class = block.classes[1] }) }
  if typst then
    if next(entry.links) then
      local links_of_block = typst_dictionary(entry.links)
      table.insert(out, 1, typst_block("#noweb-links.update(" .. links_of_block .. ")"))
      table.insert(out, typst_block("#noweb-links.update((:))"))
    end
    if label then
      table.insert(out, 1, typst_block("#src-label(" .. typst_string(label) .. ", "
        .. typst_string(anchor) .. ")"))
    end
    if #remark > 0 then
      local text = pandoc.write(pandoc.Pandoc({ pandoc.Plain(remark) }), "typst")
      table.insert(out, typst_block("#src-note[" .. text .. "]"))
    end
    return out
  end
  if label then
    table.insert(out, 1, pandoc.Plain({ pandoc.Code(label) }))
  end
  if #remark > 0 then
    table.insert(out, pandoc.Para(remark))
  end
  return out
end

local function file_places(anchors)
  if typst then
    local list = {}
    for _, anchor in ipairs(anchors) do
      table.insert(list, typst_string(anchor))
    end
    local call = "#block-pages((" .. table.concat(list, ", ") .. ",));"
    return { pandoc.RawInline("typst", call) }
  end
  local firsts, seen = {}, {}
  for _, anchor in ipairs(anchors) do
    local section = sections[anchor]
    if section and not seen[section] then
      seen[section] = true
      table.insert(firsts, anchor)
    end
  end
  return series(places(firsts, false))
end

local function index(doc)
  local names, files = {}, {}
  for _, fragment in ipairs(links.fragments) do
    local line = pandoc.Inlines({ pandoc.Code(name_text(fragment.name)),
                                  pandoc.Str(":"), pandoc.Space() })
    line:extend(series(places(fragment.parts, false)))
    line:extend({ pandoc.Str(";"), pandoc.Space() })
    line:extend(pandoc.Inlines("used in "))
    line:extend(series(places(fragment.used_in, true)))
    line:insert(pandoc.Str("."))
    table.insert(names, { pandoc.Plain(line) })
  end
  for _, file in ipairs(links.files) do
    local count = #file.blocks .. (#file.blocks == 1 and " block" or " blocks")
    local line = pandoc.Inlines({ pandoc.Code(file.path), pandoc.Str(":"),
                                  pandoc.Space() })
    line:extend(pandoc.Inlines(count .. ", "))
    line:extend(file_places(file.blocks))
    line:insert(pandoc.Str("."))
    table.insert(files, { pandoc.Plain(line) })
  end
  local level = 1
  for _, block in ipairs(doc.blocks) do
    if block.t == "Header" then
      level = block.level
      break
    end
  end
  return {
    pandoc.Header(level, "Index", { id = "index", class = "unnumbered" }),
    pandoc.Para(pandoc.Inlines("The names that noweb references use, where each is "
      .. "defined and where it is used; then the files the book tangles, and where "
      .. "their blocks are.")),
    pandoc.Header(level + 1, "Names", { id = "names", class = "unnumbered" }),
    pandoc.BulletList(names),
    pandoc.Header(level + 1, "Files", { id = "files", class = "unnumbered" }),
    pandoc.BulletList(files),
  }
end

local function with_index(doc)
  doc.blocks:extend(index(doc))
  return doc
end

local function without_properties(header)
  header.attributes = {}
  return header
end

local function html_inline_code(code)
  local name = code.text:match("^<<(.+)>>$")
  local fragment = name and fragment_named[name]
  if fragment then
    local href = "#" .. escape_html(fragment.parts[1])
    return pandoc.RawInline("html", '<a class="ref" href="' .. href .. '">'
      .. escape_html(name_text(name)) .. "</a>")
  end
  local text = escape_html(code.text):gsub("%S+", function(word)
    return '<span class="nb">' .. word:gsub("/(.)", '/</span><wbr><span class="nb">%1')
      .. "</span>"
  end)
  return pandoc.RawInline("html", "<code>" .. text .. "</code>")
end

local heading_ids = {}

local function note_headings(doc)
  local around = nil
  doc:walk({
    traverse = "topdown",
    Header = function(header)
      around = header.identifier
      local line = header.attributes["mlplcode-heading"]
      if line then
        heading_ids[line] = header.identifier
      end
    end,
    Span = function(span)
      local line = span.identifier:match("^heading:(%d+)$")
      if line then
        heading_ids[line] = (html or typst) and span.identifier or around
      end
    end,
  })
end

local function heading_link(span)
  if span.identifier:match("^heading:%d+$") then
    if html then
      return nil
    elseif typst then
      return pandoc.RawInline("typst", "#metadata(none)<" .. span.identifier .. ">")
    end
    return {}
  end
  local target = span.classes:includes("spurious-link") and span.attributes.target
  if not target or target:sub(1, 1) ~= "*" then
    return nil
  end
  local id = heading_ids[target:match("^%*heading:(%d+)$") or ""]
  if not id then
    error("a link to a heading that the export did not check: [[" .. target .. "]]")
  end
  local text = span.content
  if #text == 1 and text[1].t == "Emph" then
    text = text[1].content
  end
  local link = pandoc.Link(text, "#" .. id)
  if typst then
    local page = pandoc.RawInline("typst", "#page-ref(" .. typst_string(id) .. ");")
    return { link, pandoc.Str("\u{A0}("), page, pandoc.Str(")") }
  end
  return link
end

return {
  { RawBlock = take_cross_references, Pandoc = into_parts },
  { Pandoc = note_sections },
  { Pandoc = note_headings },
  { CodeBlock = src_block, Header = without_properties, Span = heading_link,
    Pandoc = with_index },
  { Code = html and html_inline_code or nil },
}
