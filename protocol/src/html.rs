//! HTML/XML escaping, one copy for every page and chart the processes render (the control
//! plane's UI charts and report, the serving tier's features page).

/// Escapes text for HTML/XML element content and quoted attribute values: `& < > " '`.
pub fn escape(s: &str) -> String {
    escape_with(s, |_, _| false)
}

/// [`escape`], except where `special` handles a character first: it gets each character and the
/// output, and returns true when it wrote that character itself (a format with more specials
/// than HTML, such as Markdown, or one that keeps quotes as they are).
pub fn escape_with(s: &str, mut special: impl FnMut(char, &mut String) -> bool) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if special(c, &mut out) {
            continue;
        }
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_html_special_is_escaped_and_the_rest_kept() {
        assert_eq!(
            escape(r#"<a href="x">Tom & 'Jerry'</a> ü"#),
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; &#39;Jerry&#39;&lt;/a&gt; ü"
        );
    }

    #[test]
    fn a_special_handler_writes_its_own_characters_first() {
        let out = escape_with("a|b\"<", |c, o| match c {
            '|' => {
                o.push_str("\\|");
                true
            }
            '"' => {
                o.push(c);
                true
            }
            _ => false,
        });
        assert_eq!(out, "a\\|b\"&lt;");
    }
}
