//! A small XML element tree for vim25 SOAP responses, plus escaping for request bodies.
//!
//! Why not serde: vim25 marks polymorphic values with `xsi:type` and managed-object
//! references with a plain `type` attribute, often on the same element
//! (`<val xsi:type="ManagedObjectReference" type="HostSystem">host-21</val>`). A serde
//! mapping by local name sees two `type` attributes and fails. So responses are read into
//! this tree (names without namespace prefixes, attributes keeping their qualified names)
//! and the typed structs in [`super::vim25`] are built from it with explicit accessors.

use std::borrow::Cow;

use quick_xml::events::Event;
use quick_xml::reader::Reader;

/// One XML element: local name, attributes (qualified names), text and children.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Element {
    /// The local name (namespace prefix removed).
    pub name: String,
    /// Attributes as `(qualified name, unescaped value)`.
    pub attrs: Vec<(String, String)>,
    /// The element's own text (unescaped, concatenated, trimmed).
    pub text: String,
    /// Child elements in document order.
    pub children: Vec<Element>,
}

impl Element {
    /// The first child with this local name.
    pub fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.name == name)
    }

    /// All children with this local name.
    pub fn children_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The text of the first child with this local name.
    pub fn child_text(&self, name: &str) -> Option<&str> {
        self.child(name).map(|c| c.text.as_str())
    }

    /// An attribute by exact qualified name (e.g. `type`, `xsi:type`).
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The `xsi:type` attribute, whatever prefix the document bound to the XSI namespace.
    pub fn xsi_type(&self) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k.rsplit_once(':').is_some_and(|(_, local)| local == "type"))
            .map(|(_, v)| v.as_str())
    }

    /// Depth-first search for the first descendant (or self) with this local name.
    pub fn find(&self, name: &str) -> Option<&Element> {
        if self.name == name {
            return Some(self);
        }
        self.children.iter().find_map(|c| c.find(name))
    }
}

/// Parses a document into its root element.
pub fn parse(doc: &str) -> Result<Element, String> {
    let mut reader = Reader::from_str(doc);
    let mut stack: Vec<(Element, String)> = Vec::new();
    let mut root: Option<Element> = None;
    loop {
        let event = reader
            .read_event()
            .map_err(|e| format!("XML error at byte {}: {e}", reader.buffer_position()))?;
        match event {
            Event::Start(start) => stack.push((open(&start)?, String::new())),
            Event::Empty(start) => {
                let element = open(&start)?;
                close(&mut stack, &mut root, element, String::new())?;
            }
            Event::End(_) => {
                let Some((element, raw)) = stack.pop() else {
                    return Err("unbalanced end tag".into());
                };
                close(&mut stack, &mut root, element, raw)?;
            }
            Event::Text(text) => {
                if let Some((_, raw)) = stack.last_mut() {
                    raw.push_str(&text.into_inner());
                }
            }
            Event::CData(data) => {
                if let Some((_, raw)) = stack.last_mut() {
                    raw.push_str(&escape(&data.into_inner()));
                }
            }
            Event::GeneralRef(r) => {
                if let Some((_, raw)) = stack.last_mut() {
                    raw.push('&');
                    raw.push_str(&r.into_inner());
                    raw.push(';');
                }
            }
            Event::Eof => break,
            _ => {}
        }
    }
    if !stack.is_empty() {
        return Err("document ended inside an element".into());
    }
    root.ok_or_else(|| "empty document".into())
}

fn open(start: &quick_xml::events::BytesStart<'_>) -> Result<Element, String> {
    let name = start.local_name().as_ref().to_string();
    let mut attrs = Vec::new();
    for attr in start.attributes() {
        let attr = attr.map_err(|e| format!("bad attribute in <{name}>: {e}"))?;
        let key = attr.key.as_ref().to_string();
        let value = attr
            .normalized_value(quick_xml::XmlVersion::Implicit1_0)
            .map_err(|e| format!("bad attribute value in <{name}>: {e}"))?;
        attrs.push((key, value.into_owned()));
    }
    Ok(Element { name, attrs, ..Element::default() })
}

fn close(
    stack: &mut [(Element, String)],
    root: &mut Option<Element>,
    mut element: Element,
    raw: String,
) -> Result<(), String> {
    let text = quick_xml::escape::unescape(&raw)
        .map_err(|e| format!("bad text in <{}>: {e}", element.name))?;
    element.text = text.trim().to_string();
    match stack.last_mut() {
        Some((parent, _)) => parent.children.push(element),
        None => *root = Some(element),
    }
    Ok(())
}

/// Escapes text for an XML body.
pub fn escape(s: &str) -> Cow<'_, str> {
    quick_xml::escape::escape(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_both_type_attributes_and_strips_prefixes() {
        let doc = r#"<soapenv:Envelope xmlns:soapenv="x" xmlns:xsi="y"><soapenv:Body>
            <propSet><name>parent</name><val xsi:type="ManagedObjectReference" type="HostSystem">host-1</val></propSet>
            <t>a &amp; b &lt;c&gt; &#65;</t></soapenv:Body></soapenv:Envelope>"#;
        let root = parse(doc).unwrap();
        assert_eq!(root.name, "Envelope");
        let val = root.find("val").unwrap();
        assert_eq!(val.attr("type"), Some("HostSystem"));
        assert_eq!(val.xsi_type(), Some("ManagedObjectReference"));
        assert_eq!(val.text, "host-1");
        assert_eq!(root.find("t").unwrap().text, "a & b <c> A");
    }

    #[test]
    fn rejects_truncated_documents() {
        assert!(parse("<a><b>").is_err());
        assert!(parse("").is_err());
    }

    #[test]
    fn escapes_request_values() {
        assert_eq!(escape("a<b&\"c\""), "a&lt;b&amp;&quot;c&quot;");
    }
}
