// Measures a rendered deck in Chromium: for every slide, the height of its content against the frame, and
// every code block that Marp's auto-scaling shrank. Exits with 1 if a slide overflows or a block is shrunk.
// tests/test_slides.py estimates the same heights from the Markdown; its constants were measured with this.
//
//   CHROME_PATH=$(command -v chromium) npx --yes @marp-team/marp-cli@4.5.1 slides/workshop.md \
//       --template bare -o /tmp/workshop.html
//   NODE_PATH=<a node_modules holding puppeteer-core, e.g. marp-cli's> node slides/measure.cjs /tmp/workshop.html
const path = require('path');
const puppeteer = require('puppeteer-core');

(async () => {
  const browser = await puppeteer.launch({executablePath: process.env.CHROME_PATH || 'chromium', args: ['--no-sandbox']});
  const page = await browser.newPage();
  await page.setViewport({width: 1280, height: 720});
  await page.goto('file://' + path.resolve(process.argv[2]), {waitUntil: 'load'});
  await new Promise(resolve => setTimeout(resolve, 1000)); // Marp's auto-scaling runs after load
  const slides = await page.evaluate(() => [...document.querySelectorAll('section[id]')].map((section, i) => {
    const frame = section.getBoundingClientRect();
    const style = getComputedStyle(section);
    const inner = frame.height - parseFloat(style.paddingTop) - parseFloat(style.paddingBottom);
    const blocks = [...section.children].filter(c => !['HEADER', 'FOOTER'].includes(c.tagName))
      .map(c => c.getBoundingClientRect()).filter(r => r.height > 0);
    const content = blocks.length ? Math.max(...blocks.map(r => r.bottom)) - Math.min(...blocks.map(r => r.top)) : 0;
    const scales = [...section.querySelectorAll('marp-pre')].map(pre => {
      const scaling = pre.shadowRoot && pre.shadowRoot.querySelector('marp-auto-scaling');
      const svg = scaling && scaling.shadowRoot && scaling.shadowRoot.querySelector('svg');
      const box = svg && svg.viewBox.baseVal;
      return box && box.width ? Math.min(1, svg.getBoundingClientRect().width / box.width) : 1;
    });
    const title = section.querySelector('h1, h2');
    return {slide: i + 1, title: title ? title.textContent : '', content: Math.round(content), frame: Math.round(inner),
            shrunk: scales.filter(s => s < 0.999).map(s => s.toFixed(3))};
  }));
  await browser.close();
  let bad = 0;
  for (const s of slides) {
    const problem = s.content > s.frame ? 'OVERFLOWS' : s.shrunk.length ? `CODE SHRUNK to ${s.shrunk}` : '';
    bad += problem ? 1 : 0;
    console.log(`${String(s.slide).padStart(3)}  ${String(s.content).padStart(4)} / ${s.frame} px  ${problem}  ${s.title}`);
  }
  process.exit(bad ? 1 : 0);
})();
